"""Compressors: the interface (core.py), FedPAQ's QSGD (Reisizadeh et al.,
AISTATS 2020) and FedAT's polyline (Chai et al., SC'21, Sec. 4.3)."""
from fedjax_lama.compression.core import base_key
from fedjax_lama.compression.core import compress_clients
from fedjax_lama.compression.core import Compressor
from fedjax_lama.compression.core import float32_bits
from fedjax_lama.compression.core import identity
from fedjax_lama.compression.core import is_identity
from fedjax_lama.compression.core import is_scalar_upload
from fedjax_lama.compression.core import leaf_bits
from fedjax_lama.compression.polyline import decode_tree
from fedjax_lama.compression.polyline import encode_tree
from fedjax_lama.compression.polyline import polyline_decode
from fedjax_lama.compression.polyline import polyline_encode
from fedjax_lama.compression.polyline import polyline_roundtrip
from fedjax_lama.compression.polyline import PolylineMessage
from fedjax_lama.compression.polyline import roundtrip_tree
from fedjax_lama.compression.polyline import tree_message_bytes
from fedjax_lama.compression.qsgd import BLOCKS
from fedjax_lama.compression.qsgd import dequantize
from fedjax_lama.compression.qsgd import qsgd
from fedjax_lama.compression.qsgd import qsgd_block_bits
from fedjax_lama.compression.qsgd import quantize
from fedjax_lama.compression.qsgd import QsgdPayload

# Every compressor by its config name (config.compressor.name), with its builder.
COMPRESSORS = {"identity": lambda levels, block: identity(), "qsgd": qsgd}
