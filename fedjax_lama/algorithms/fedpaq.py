"""FedPAQ: periodic averaging with quantized uploads (algorithms.md 5.10).

A. Reisizadeh, A. Mokhtari, H. Hassani, A. Jadbabaie, R. Pedarsani, "FedPAQ: A
Communication-Efficient Federated Learning Method with Periodic Averaging and
Quantization", AISTATS 2020. Local training and the server step are FedAvg's; what
differs is the uplink: each client sends Q_s(delta_i) (fedjax_lama.compress.qsgd), which
the round engine applies through `config.compressor` ("auto" resolves to QSGD, 16 levels
per leaf, for this algorithm). With the identity compressor it is FedAvg exactly.
"""
import dataclasses

from fedjax_lama.algorithms.base import Algorithm
from fedjax_lama.algorithms.fedavg import fedavg


def fedpaq(**fedavg_kwargs) -> Algorithm:
  return dataclasses.replace(fedavg(**fedavg_kwargs), name="fedpaq")
