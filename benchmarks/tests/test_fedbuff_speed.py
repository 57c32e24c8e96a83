"""The FedBuff speed check's verdict: paired ratios, their median and the one-line answer."""
import pytest

from benchmarks import fedbuff_speed


def test_verdict_holds_on_the_median_of_paired_wall_ratios(capsys):
  walls = {"fedasync": [2.0, 1.0, 4.0], "fedbuff": [1.0, 1.5, 3.0]}  # ratios 0.5, 1.5, 0.75
  cpus = {"fedasync": [1.0, 1.0, 1.0], "fedbuff": [1.2, 1.1, 1.3]}
  result = fedbuff_speed.verdict(walls, cpus, concurrency=10, mode="engine")
  assert result["wall_ratios"] == pytest.approx([0.5, 1.5, 0.75])
  assert result["wall_ratio"] == pytest.approx(0.75)
  assert result["cpu_ratio"] == pytest.approx(1.2)
  assert result["verdict"] == "HOLDS" and result["holds"] is True
  assert "VERDICT: HOLDS --" in capsys.readouterr().out


def test_verdict_fails_when_fedbuff_is_slower_in_every_one_of_five_repeats():
  walls = {"fedasync": [1.0] * 5, "fedbuff": [1.1, 1.3, 1.05, 1.2, 1.01]}
  result = fedbuff_speed.verdict(walls, walls, concurrency=4, mode="server")
  assert result["wall_ratio"] == pytest.approx(1.1)
  assert result["slower_repeats"] == 5
  assert result["sign_test_p"] == pytest.approx(1 / 32)
  assert result["verdict"] == "FAILS" and result["holds"] is False


def test_verdict_at_parity_when_the_repeats_disagree(capsys):
  # Slower in 3 of 5 repeats: equal speeds give that or worse with p = 16/32.
  walls = {"fedasync": [1.0] * 5, "fedbuff": [0.95, 1.05, 1.03, 1.1, 0.88]}
  result = fedbuff_speed.verdict(walls, walls, concurrency=10, mode="engine")
  assert result["wall_ratio"] == pytest.approx(1.03)
  assert result["sign_test_p"] == pytest.approx(0.5)
  assert result["verdict"] == "HOLDS, at parity" and result["holds"] is True
  assert "VERDICT: HOLDS, at parity" in capsys.readouterr().out


def test_sign_test_tail_by_hand():
  assert fedbuff_speed.slower_p_value(0, 5) == 1.0
  assert fedbuff_speed.slower_p_value(9, 10) == pytest.approx(11 / 1024)
