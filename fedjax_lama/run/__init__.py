"""One run: config -> validation -> a typed run specification -> the loop.

  spec.py      build_spec(config): validates the config as given and reads it, once, into a
               RunSpec (the run's mode, data, federation, model, algorithm, options, plan).
  workdir.py   what a workdir must be, and the run it may already hold (resume, extension).
  parts.py     the data, federation, model, mesh and round program a RunSpec describes.
  records.py   the run's bookkeeping: metrics, checkpoints, evaluation, summary.
  pipeline.py  train_and_evaluate(config, workdir): the pipeline on one page, and the loop
               of synchronous rounds.
  many.py      train_many: runs of one config trained together.
  pretrained.py  another run's parameters: where a run starts from (config.init_from) and
               the merged export of a run's model as plain parameters.
"""
