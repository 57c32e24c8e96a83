"""User-level differential privacy over any synchronous algorithm.

The pure parts: typed options (`dp_options`), clipping and noise over pytrees
(`mechanisms`), cohorts the accountant can rely on (`cohort_sampling`) and the accounting
with dp-accounting (`accounting`, needs the `privacy` extra and is imported on its own:
`from fedjax_lama.privacy import accounting`).
"""
from fedjax_lama.privacy.cohort_sampling import (CohortChunk, cohort_chunks, poisson_capacity,
                                                 poisson_cohort, sample_cohort)
from fedjax_lama.privacy.dp_options import (AdaptiveClipOptions, DpOptions, SamplingOptions,
                                            update_noise_multiplier)
from fedjax_lama.privacy.mechanisms import (DpStage, DpState, adaptive_clip_step,
                                            add_gaussian_noise, clip_flat, clip_per_layer,
                                            global_norm, layer_clip_norms, noised_mean,
                                            user_level_dp)
