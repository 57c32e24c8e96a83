"""FedJAX 0.0.17 for the peer tests, or a module-level skip that names its install."""
import importlib.util
import os

import pytest

from third_party import fedjax_peer

PEERS_PATH = os.environ.get("FEDJAX_LAMA_PEERS_PATH", "")
MISSING = ("FedJAX is not installed: pip install --no-deps --target DIR -r "
           "requirements-peers.txt, then FEDJAX_LAMA_PEERS_PATH=DIR")


def fedjax_or_skip():
  """The fedjax module (third_party.fedjax_peer.import_fedjax), or skips the calling test
  module. It looks before importing: import_fedjax shims jax for FedJAX, which a skipped
  module should not."""
  if importlib.util.find_spec("fedjax") is None and not (
      PEERS_PATH and os.path.isdir(os.path.join(PEERS_PATH, "fedjax"))):
    pytest.skip(MISSING, allow_module_level=True)
  fedjax = fedjax_peer.import_fedjax(PEERS_PATH)
  if fedjax is None:
    pytest.skip(MISSING, allow_module_level=True)
  return fedjax
