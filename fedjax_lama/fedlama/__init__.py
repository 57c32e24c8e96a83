"""FedLAMA's pieces together: the interval selector, layer bookkeeping, the layer-masked
aggregation primitive, the options and the schedule program (FedLAMA, Lee, Zhang, Avestimehr, AAAI
2023)."""
from fedjax_lama.fedlama.layer_sync import layer_discrepancy
from fedjax_lama.fedlama.layer_sync import layer_masked_mean
from fedjax_lama.fedlama.layer_units import layer_spec
from fedjax_lama.fedlama.layer_units import LayerSpec
from fedjax_lama.fedlama.options import FedLamaOptions
from fedjax_lama.fedlama.options import NAME
from fedjax_lama.fedlama.selection import base_multipliers
from fedjax_lama.fedlama.selection import interval_unit
from fedjax_lama.fedlama.selection import RULES
from fedjax_lama.fedlama.selection import select_intervals
from fedjax_lama.fedlama.selection import selection_curves
from fedjax_lama.fedlama.selection import window_length
