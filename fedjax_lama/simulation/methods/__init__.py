"""Methods on the virtual clock (Chai et al., SC'21, Sec. 4; FedAT's baselines, Chai et al., SC'21,
Sec. 6): FedAT and its baselines."""
from fedjax_lama.simulation.methods.asofed import ASOFed
from fedjax_lama.simulation.methods.base import Arrival, Method, SyncRound
from fedjax_lama.simulation.methods.fedasync import FedAsync, staleness_weight
from fedjax_lama.simulation.methods.fedbuff import FedBuff
from fedjax_lama.simulation.methods.fedat import FedAT, cross_tier_fractions, cross_tier_weights
from fedjax_lama.simulation.methods.sync_fedavg import FedAvg, FedProx, fedprox_epochs
from fedjax_lama.simulation.methods.tifl import TiFL, change_probs, select_tier

METHODS = {cls.name: cls for cls in (FedAT, FedAvg, FedProx, TiFL, FedAsync, ASOFed, FedBuff)}

__all__ = ["ASOFed", "Arrival", "FedAT", "FedAsync", "FedAvg", "FedBuff", "FedProx", "METHODS",
           "Method", "SyncRound", "TiFL", "change_probs", "cross_tier_fractions", "cross_tier_weights",
           "fedprox_epochs", "select_tier", "staleness_weight"]
