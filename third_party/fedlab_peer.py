"""FedLab's FedProx, SCAFFOLD and FedNova driven on fixed batches, for equivalence checks.

FedLab (fedlab on PyPI, https://github.com/SMILELab-FL/FedLab; Zeng et al., "FedLab: A
Flexible Federated Learning Framework", JMLR 24(100), 2023) simulates a federation in one
process with a serial client trainer (every client's local SGD in PyTorch) and a server
handler (the aggregation), joined by the loop of its `StandalonePipeline.main`:

    sampled = handler.sample_clients(); trainer.local_process(handler.downlink_package, sampled)
    for pack in trainer.uplink_package: handler.load(pack)

This adapter runs exactly that loop with FedLab's own classes (fedlab.contrib.algorithm:
FedProxSerialClientTrainer + FedProxServerHandler, ScaffoldSerialClientTrainer +
ScaffoldServerHandler, FedNovaSerialClientTrainer + FedNovaServerHandler), every client
sampled each round, on a dataset of fixed batches (FedLab's trainers call
`dataset.get_dataloader(id, batch_size)` and iterate over it: here, the same list of
(x, y) tensors in every round), in float64. It reads the server parameters and the
algorithm's state after each round: SCAFFOLD's global and per-client control variates,
FedNova's uploaded step counts tau_i and tau_eff (sum_i p_i tau_i with FedLab's p_i = 1/m).

The PyPI release fedlab==1.3.0 imports its dataset zoo (torchvision's MNIST and CIFAR-10
readers) when `fedlab.core` is imported; none of it is used here. PyPI's torchvision wheels
are built against CUDA PyTorch and do not load beside the CPU build of PyTorch; when
torchvision is not installed, `_fedlab()` puts an empty module in its place so that the import succeeds
(any use of a torchvision dataset would then fail loudly with an AttributeError).
FedLab and PyTorch are optional dependencies (requirements-peers.txt).
"""
import contextlib
import sys
import types
from typing import Callable, Sequence

import numpy as np

ALGORITHMS = ("fedprox", "scaffold", "fednova")


def _fedlab():
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("PyTorch is not installed: FedLab needs it (requirements-peers.txt)") from e
  try:
    import torchvision  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    placeholder = types.ModuleType("torchvision")
    placeholder.transforms = types.ModuleType("torchvision.transforms")
    sys.modules.setdefault("torchvision", placeholder)
    sys.modules.setdefault("torchvision.transforms", placeholder.transforms)
  try:
    import fedlab  # pylint: disable=g-import-not-at-top
    from fedlab.contrib import algorithm  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("FedLab is not installed: pip install --no-deps fedlab==1.3.0 "
                      "(requirements-peers.txt; into a virtual environment of its own)") from e
  return fedlab


def version() -> str:
  return _fedlab().__version__


@contextlib.contextmanager
def _float64():
  import torch  # pylint: disable=g-import-not-at-top
  before = torch.get_default_dtype()
  torch.set_default_dtype(torch.float64)
  try:
    yield
  finally:
    torch.set_default_dtype(before)


class FixedBatches:
  """A FedLab dataset whose client `i` yields the same batches (x, y) in every round."""

  def __init__(self, client_batches: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]]):
    import torch  # pylint: disable=g-import-not-at-top
    self.batches = [[(torch.as_tensor(np.asarray(x, np.float64)), torch.as_tensor(np.asarray(y)))
                     for x, y in batches] for batches in client_batches]

  def get_dataloader(self, client_id, batch_size):
    del batch_size  # the batches are fixed
    return self.batches[client_id]


def _named(model, flat) -> dict:
  """FedLab's flat parameter vector -> {torch parameter name: numpy array}."""
  out, start = {}, 0
  for name, p in model.named_parameters():
    out[name] = flat[start:start + p.numel()].reshape(p.shape).detach().numpy().copy()
    start += p.numel()
  assert start == flat.numel()
  return out


def run_rounds(name: str, make_model: Callable, initial: dict, client_batches, rounds: int, *,
               lr: float, mu: float = 0.0, server_lr: float = 1.0) -> list[dict]:
  """Runs FedLab's algorithm `name` for `rounds` rounds, every client sampled each round.

  Args:
    name: one of ALGORITHMS.
    make_model: () -> a torch.nn.Module (built in float64 here).
    initial: {torch parameter name: numpy array}, the initial server model.
    client_batches: for each client, its list of (x, y) batches (one local epoch).
    rounds: how many rounds.
    lr: the clients' SGD learning rate.
    mu: FedProx's proximal coefficient.
    server_lr: SCAFFOLD's global learning rate.

  Returns:
    One dict per round: "params" {name: array}; SCAFFOLD: "c" {name: array} and "c_i"
    [per client {name: array}]; FedNova: "tau" [per client steps], "tau_eff".
  """
  _fedlab()
  import torch  # pylint: disable=g-import-not-at-top
  from fedlab.contrib import algorithm as fl  # pylint: disable=g-import-not-at-top
  if name not in ALGORITHMS:
    raise ValueError(f"algorithm {name!r} is not driven here; accepted: {', '.join(ALGORITHMS)}")
  num_clients = len(client_batches)
  batch_size = len(client_batches[0][0][1])
  with _float64():
    model = make_model().double()
    with torch.no_grad():
      for pname, p in model.named_parameters():
        p.copy_(torch.as_tensor(np.asarray(initial[pname], np.float64)))
    if name == "fedprox":
      trainer = fl.FedProxSerialClientTrainer(model, num_clients)
      trainer.setup_optim(1, batch_size, lr, mu)
      handler = fl.FedProxServerHandler(model, global_round=rounds, sample_ratio=1.0)
    elif name == "scaffold":
      trainer = fl.ScaffoldSerialClientTrainer(model, num_clients)
      trainer.setup_optim(1, batch_size, lr)
      handler = fl.ScaffoldServerHandler(model, global_round=rounds, sample_ratio=1.0)
      handler.setup_optim(server_lr)
    else:
      trainer = fl.FedNovaSerialClientTrainer(model, num_clients)
      trainer.setup_optim(1, batch_size, lr)
      handler = fl.FedNovaServerHandler(model, global_round=rounds, sample_ratio=1.0)
      handler.setup_optim(option="weighted_scale")
    trainer.setup_dataset(FixedBatches(client_batches))
    handler.num_clients = trainer.num_clients  # as StandalonePipeline.__init__
    history = []
    while not handler.if_stop:  # StandalonePipeline.main
      sampled = handler.sample_clients()
      assert sampled == list(range(num_clients)), sampled
      trainer.local_process(handler.downlink_package, sampled)
      uploads = trainer.uplink_package
      for pack in uploads:
        handler.load(pack)
      record = {"params": _named(handler.model, handler.model_parameters)}
      if name == "scaffold":
        record["c"] = _named(handler.model, handler.global_c)
        record["c_i"] = [_named(handler.model, c) for c in trainer.cs]
      elif name == "fednova":
        record["tau"] = [float(pack[1].item()) for pack in uploads]
        # FedNovaServerHandler's p_k = 1 / m for every k: tau_eff is the mean.
        record["tau_eff"] = float(np.mean(record["tau"]))
      history.append(record)
  return history
