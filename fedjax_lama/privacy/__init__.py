"""User-level differential privacy over any synchronous algorithm.

The pure parts: typed options (`dp_options`), the clipping rules (`clipping`), noise and the
DP-FedAvg stage over pytrees (`mechanisms`), cohorts the accountant can rely on (`cohort_sampling`) and the accounting
with dp-accounting (`accounting`, needs the `privacy` extra and is imported on its own:
`from fedjax_lama.privacy import accounting`).
"""
from fedjax_lama.privacy.cohort_sampling import (CohortChunk, cohort_chunks, poisson_capacity,
                                                 poisson_cohort, sample_cohort)
from fedjax_lama.privacy.dp_options import (AdaptiveClipOptions, DpOptions, SamplingOptions,
                                            update_noise_multiplier)
from fedjax_lama.privacy.clipping import CLIPPINGS, layer_clip_norms
from fedjax_lama.privacy.mechanisms import (DpState, adaptive_clip_step, add_gaussian_noise,
                                            noised_mean, user_level_dp)
