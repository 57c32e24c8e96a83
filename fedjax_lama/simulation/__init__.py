"""Host-side asynchronous/tiered simulation: FedAT and its baselines on a virtual clock.

The system model, FedAT, its baselines and its metrics as FedAT (Chai et al., SC'21)
describes them.
Pure numpy + Python: local training, evaluation, message encoding and model sums
are injected (interfaces.py), so the JAX engine plugs in from outside.

Typical use:

    sim = Simulator(SystemConfig(...), FedAT(FedATConfig(...)),
                    num_examples=n_k, initial_model=w0,
                    trainer=..., evaluator=..., codec=PolylineCodec())
    sim.run()
    sim.ticks, sim.summary(target=0.79), sim.event_log, sim.messages

Modules (imports are one-way, top to bottom):
  interfaces  Trainer / Evaluator / Codec / ModelAlgebra protocols, TrainJob, TrainResult
  pytree      trees_equal, NumpyAlgebra (weighted sums of numpy pytrees)
  message_codecs  RawCodec, PolylineCodec (adapter to fedjax_lama.compression.polyline)
  streams     named random streams (simulation/streams.py)
  config      SystemConfig, ComputeModel, NetworkModel and the method configs
  latency     job latency models (download, compute, straggler delay, upload)
  tiers       straggler parts, unstable clients, profiling and tiering
  events      the event queue
  metrics     tick statistics and run summaries (Chai et al., SC'21, Sec. 6)
  methods     FedAT, FedAvg, FedProx, TiFL, FedAsync, ASO-Fed, FedBuff
  loop        Simulator: the clock, jobs, deferred training, ticks, state_dict
  testing     numpy stand-ins (ShiftTrainer, SineEvaluator, RoundingCodec), make_simulator

The JAX side, imported on its own (this package's __init__ does not load it):
  run_options    ClockOptions, the typed options of a run (built by the registry)
  job_packing    minibatches of a group of jobs from stream BATCH, in jnp
  engine_adapter EngineTrainer (one vectorised engine call per batch of jobs),
                 LocalTestEvaluator, JaxAlgebra
  clock_run      the run contract on the clock (metrics, summary, plots, checkpoints,
                 exact resume); training.train_and_evaluate dispatches to it
"""
from fedjax_lama.simulation.message_codecs import PolylineCodec, RawCodec
from fedjax_lama.simulation.system_config import (ASOFedConfig, ComputeModel, FedAsyncConfig,
                                           FedATConfig, FedAvgConfig, FedBuffConfig, FedProxConfig,
                                           NetworkModel, SystemConfig, TiFLConfig)
from fedjax_lama.simulation.interfaces import (Codec, Evaluator, ModelAlgebra, Trainer, TrainJob,
                                               TrainResult)
from fedjax_lama.simulation.loop import Simulator, tick_times
from fedjax_lama.simulation.methods import (ASOFed, FedAsync, FedAT, FedAvg, FedBuff, FedProx, METHODS,
                                            TiFL, cross_tier_fractions, cross_tier_weights)
from fedjax_lama.simulation.robustness_metrics import summarize
from fedjax_lama.simulation.pytree import NumpyAlgebra
from fedjax_lama.simulation.streams import Stream

__all__ = [
    "ASOFed", "ASOFedConfig", "Codec", "ComputeModel", "Evaluator", "FedAT", "FedATConfig",
    "FedAsync", "FedAsyncConfig", "FedAvg", "FedAvgConfig", "FedBuff", "FedBuffConfig",
    "FedProx", "FedProxConfig",
    "METHODS", "ModelAlgebra", "NetworkModel", "NumpyAlgebra", "PolylineCodec", "RawCodec",
    "Simulator", "Stream", "SystemConfig", "TiFL", "TiFLConfig", "TrainJob", "TrainResult",
    "Trainer", "cross_tier_fractions", "cross_tier_weights", "summarize", "tick_times",
]
