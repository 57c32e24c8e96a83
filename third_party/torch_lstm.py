"""The character LSTM of `lstm_lm` in PyTorch, trained the way PyTorch simulators train a
cohort: one client after another, plain SGD on each batch, then the mean of the clients'
models. The baseline of `python -m benchmarks.benchmark --model=lstm_lm --peers=torch`.

The module is `torch.nn.Embedding`, one `torch.nn.LSTM` per layer (each optionally followed
by a tanh, `lstm_lm`'s `tanh_outputs`), `torch.nn.Linear`; the loss is the mean
cross-entropy over every position (`torch.nn.functional.cross_entropy`), as `lstm_lm`'s on
unpadded windows. Weights come from our parameters (`torch_state`): PyTorch's LSTM keeps
the four gates stacked as rows in the order i, f, g, o (flax's order) with two biases per
gate (input and recurrent), so our input kernels become `weight_ih`, our recurrent kernels
and bias `weight_hh` and `bias_hh`, and `bias_ih` is zero and frozen (trained, it would
receive the same gradient as `bias_hh`, and the gate's bias would move twice as fast as
our one bias). PyTorch is optional (requirements-peers.txt: a virtual environment of its
own).
"""
import numpy as np

GATES = "ifgo"  # flax's OptimizedLSTMCell and torch.nn.LSTM alike


def import_torch():
  """The `torch` module, or None when it is not installed."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return torch


def version() -> str:
  return import_torch().__version__


def build(torch, vocab_size: int, num_classes: int, embed_size: int, hidden_size: int,
          num_layers: int, tanh_outputs: bool):
  """The LSTM LM as a torch.nn.Module: int64 tokens [batch, time] -> logits."""
  nn = torch.nn

  class LSTMLM(nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn.Embedding(vocab_size, embed_size)
      self.lstms = nn.ModuleList(
          nn.LSTM(embed_size if k == 0 else hidden_size, hidden_size, batch_first=True)
          for k in range(num_layers))
      self.out = nn.Linear(hidden_size, num_classes)

    def forward(self, tokens):
      x = self.embed(tokens)
      for lstm in self.lstms:
        x, _ = lstm(x)
        if tanh_outputs:
          x = torch.tanh(x)
      return self.out(x)

  return LSTMLM()


def torch_state(torch, params, num_layers: int) -> dict:
  """Our `lstm_lm` parameters (no batch norm) as the module's state dict."""
  f32 = lambda a: torch.from_numpy(np.array(a, np.float32))
  state = {"embed.weight": f32(params["Embed_0"]["embedding"]),
           "out.weight": f32(np.asarray(params["Dense_0"]["kernel"]).T),
           "out.bias": f32(params["Dense_0"]["bias"])}
  for k in range(num_layers):
    cell = params[f"OptimizedLSTMCell_{k}"]
    stack = lambda kind, cell=cell: np.concatenate(
        [np.asarray(cell[kind + g]["kernel"]) for g in GATES], axis=1).T
    bias = np.concatenate([np.asarray(cell["h" + g]["bias"]) for g in GATES])
    state[f"lstms.{k}.weight_ih_l0"] = f32(stack("i"))
    state[f"lstms.{k}.weight_hh_l0"] = f32(stack("h"))
    state[f"lstms.{k}.bias_hh_l0"] = f32(bias)
    state[f"lstms.{k}.bias_ih_l0"] = f32(np.zeros_like(bias))
  return state


def our_params(state, num_layers: int) -> dict:
  """The inverse of `torch_state` (numpy float32; the two biases of a gate summed)."""
  get = lambda name: state[name].detach().cpu().numpy()
  out = {"Embed_0": {"embedding": get("embed.weight")},
         "Dense_0": {"kernel": get("out.weight").T, "bias": get("out.bias")}}
  for k in range(num_layers):
    w_ih, w_hh = get(f"lstms.{k}.weight_ih_l0"), get(f"lstms.{k}.weight_hh_l0")
    bias = get(f"lstms.{k}.bias_ih_l0") + get(f"lstms.{k}.bias_hh_l0")
    hidden = w_hh.shape[1]
    cell = {}
    for j, g in enumerate(GATES):
      rows = slice(j * hidden, (j + 1) * hidden)
      cell["i" + g] = {"kernel": w_ih[rows].T}
      cell["h" + g] = {"kernel": w_hh[rows].T, "bias": bias[rows]}
    out[f"OptimizedLSTMCell_{k}"] = cell
  return out


def fed_avg_loop(torch, options: dict, params, batches, lr: float, threads: int):
  """run() -> the new global model's state dict after one FedAvg round in PyTorch
  (`our_params` gives it in our layout).

  options: lstm_lm's (vocab_size, num_classes, embed_size, hidden_size, num_layers,
  tanh_outputs). batches[c][k] = client c's (x, y) of step k (int tokens and next-token
  targets [batch, time]). Each client in turn loads the global weights, takes one SGD(lr)
  step per batch and leaves its weights; the new global model is their uniform mean (equal
  client sizes). `threads`: torch.set_num_threads.
  """
  torch.set_num_threads(threads)
  num_layers = options["num_layers"]
  model = build(torch, **options)
  start = torch_state(torch, params, num_layers)
  model.load_state_dict(start)
  for lstm in model.lstms:
    lstm.bias_ih_l0.requires_grad_(False)
  data = [[(torch.from_numpy(np.asarray(x, np.int64)), torch.from_numpy(np.asarray(y, np.int64)))
           for x, y in client] for client in batches]
  loss_fn = torch.nn.functional.cross_entropy

  def run():
    total = {k: torch.zeros_like(v) for k, v in start.items()}
    for client in data:
      model.load_state_dict(start)
      optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
      for x, y in client:
        optimizer.zero_grad(set_to_none=True)
        logits = model(x)
        loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        optimizer.step()
      with torch.no_grad():
        for k, v in model.state_dict().items():
          total[k] += v
    return {k: v / len(data) for k, v in total.items()}

  return run
