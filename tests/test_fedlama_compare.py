"""Early stopping as AAAI reports it and comm_ratio_budget as experiments.fedlama_compare reports
them."""
from experiments import studies as fedlama_compare


def test_early_stop_is_the_first_evaluation_beating_the_baseline_best():
  records = [{"local_steps": 40, "test_accuracy": 0.50, "comm_ratio": 1.0},
             {"local_steps": 80, "test_accuracy": 0.70, "comm_ratio": 0.75},
             {"local_steps": 120, "test_accuracy": 0.72, "comm_ratio": 0.7}]
  stop = fedlama_compare.early_stop(records, baseline_best=0.69, total_steps=160)
  # Communication cost: C(T) / C_ref(T_budget) = comm_ratio(T) * T / T_budget.
  assert stop == {"step": 80, "accuracy": 0.70, "comm_ratio_budget": 0.75 * 80 / 160}
  assert fedlama_compare.early_stop(records, baseline_best=0.72, total_steps=160) is None


def test_aaai_table3_relation():
  """AAAI Table 3, phi = 2: 51.86 % x 1,600 / 4,000 = 20.74 %."""
  records = [{"local_steps": 1600, "test_accuracy": 0.8074, "comm_ratio": 0.5186}]
  stop = fedlama_compare.early_stop(records, 0.8072, 4000)
  assert round(100 * stop["comm_ratio_budget"], 2) == 20.74
