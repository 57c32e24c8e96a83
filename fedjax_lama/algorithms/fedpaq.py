"""FedPAQ and FedCOM: FedAvg with quantized uploads.

FedPAQ: A. Reisizadeh, A. Mokhtari, H. Hassani, A. Jadbabaie, R. Pedarsani, "FedPAQ: A
Communication-Efficient Federated Learning Method with Periodic Averaging and
Quantization", AISTATS 2020.
FedCOM: F. Haddadpour, M. M. Kamani, A. Mokhtari, M. Mahdavi, "Federated Learning with
Compression: Unified Analysis and Sharp Guarantees", AISTATS 2021.

Local training and the server step are FedAvg's (the record is fedavg's); each client
uploads Q_s(delta_i), the QSGD quantizer of fedjax_lama.compression with `levels` s per
block ("compression level 16" = 16 levels, 6 bits per coordinate). The module only declares
its default uplink compressor on its Spec (config.compressor.name="auto" takes it): the
engine compresses the declared uploads and the ledger counts their bits.
FedCOM is the same with a server learning rate (config.server_lr); server_lr = 1 is FedPAQ.
With the identity compressor both are FedAvg exactly.
"""
import dataclasses

from fedjax_lama import compression
from fedjax_lama.algorithms import fedavg
from fedjax_lama.algorithms.common import Common, NoHparams, Spec, require, require_one_of
from fedjax_lama.engine.algorithm import Algorithm


@dataclasses.dataclass(frozen=True)
class Hparams:
  levels: int = 16
  block: str = "leaf"

  def __post_init__(self):
    require(isinstance(self.levels, int) and not isinstance(self.levels, bool)
            and 1 <= self.levels <= 65535, "levels", self.levels,
            "an integer number of quantization levels in [1, 65535]")
    require_one_of("block", self.block, compression.BLOCKS)


def build(hp: Hparams, common: Common) -> Algorithm:
  del hp  # the levels and blocks are the uplink's (`uplink`)
  return fedavg.build(NoHparams(), common)


def uplink(hp: Hparams) -> compression.Compressor:
  return compression.qsgd(hp.levels, hp.block)


SPECS = (
    Spec("fedpaq", Hparams, build, "FedAvg + QSGD uploads", uplink=uplink),
    Spec("fedcom", Hparams, build, "FedPAQ with a server learning rate", uplink=uplink),
)
