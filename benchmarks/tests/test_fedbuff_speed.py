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
  assert result["holds"] is True
  assert "VERDICT: HOLDS" in capsys.readouterr().out


def test_verdict_fails_when_fedbuff_is_slower():
  walls = {"fedasync": [1.0, 1.0], "fedbuff": [1.1, 1.3]}
  result = fedbuff_speed.verdict(walls, walls, concurrency=4, mode="server")
  assert result["wall_ratio"] == pytest.approx(1.2)
  assert result["holds"] is False
