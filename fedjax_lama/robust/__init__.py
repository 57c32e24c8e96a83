"""Byzantine-robust aggregation rules (defences.py, meamed.py) and the attacks they are tested
against (attacks.py), as pure, jittable functions over a cohort's stacked uploads, each built
as an aggregation stage and registered by its config name (defences.DEFENCES,
attacks.ATTACKS)."""
from fedjax_lama.robust.attacks import ATTACKS
from fedjax_lama.robust.attacks import backdoor_examples
from fedjax_lama.robust.attacks import checkerboard
from fedjax_lama.robust.attacks import flip_labels
from fedjax_lama.robust.attacks import gaussian_noise
from fedjax_lama.robust.attacks import inner_product_manipulation
from fedjax_lama.robust.attacks import little_is_enough
from fedjax_lama.robust.attacks import little_is_enough_z
from fedjax_lama.robust.attacks import malicious_clients
from fedjax_lama.robust.attacks import model_replacement
from fedjax_lama.robust.attacks import pixel_trigger
from fedjax_lama.robust.attacks import sign_flip
from fedjax_lama.robust.attacks import substitute
from fedjax_lama.robust.attacks import upload_attack
from fedjax_lama.robust.defences import Bound
from fedjax_lama.robust.defences import build
from fedjax_lama.robust.defences import bulyan
from fedjax_lama.robust.defences import centered_clipping
from fedjax_lama.robust.defences import centered_clipping_init
from fedjax_lama.robust.defences import CenteredClippingState
from fedjax_lama.robust.defences import check_preconditions
from fedjax_lama.robust.defences import coordinate_median
from fedjax_lama.robust.defences import Defence
from fedjax_lama.robust.defences import DEFENCES
from fedjax_lama.robust.defences import geometric_median
from fedjax_lama.robust.defences import krum
from fedjax_lama.robust.defences import krum_scores
from fedjax_lama.robust.defences import multi_krum
from fedjax_lama.robust.defences import norm_bound
from fedjax_lama.robust.defences import norm_bounded_mean
from fedjax_lama.robust.defences import pairwise_sq_distances
from fedjax_lama.robust.defences import stack_rule
from fedjax_lama.robust.defences import trimmed_mean
