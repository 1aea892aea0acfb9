"""Training-health signals (verl/trainer/ppo/health.py) on synthetic metric streams and batches:
each signal trips on its failure at the step worked out here, stays quiet on a healthy stream, and
warns once per episode (hysteresis)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from verl.trainer.config.health import HEALTH_SIGNALS, HealthConfig
from verl.trainer.ppo.health import (
    HealthMonitor,
    batch_stats,
    duplicate_rows,
    repeated_ngram_rate,
    single_symbol_rows,
    validation_accuracy,
)


def healthy(step: int) -> dict:
    """A run that learns: score rises, entropy stays, lengths stay, grad norm and KL steady."""
    return {
        "health/score_mean": min(0.3 + 0.01 * step, 0.9),
        "health/best_score": 1.0,
        "actor/entropy": 0.8,
        "health/length_mean": 20.0 + (step % 3),
        "response_length/clip_ratio": 0.0,
        "health/repeat_ngram_rate": 0.05,
        "health/single_char_share": 0.0,
        "health/identical_share": 0.1,
        "health/reward_length_corr": 0.1,
        "health/dead_group_share": 0.2,
        "actor/grad_norm": 1.0 + 0.1 * (step % 4),
        "actor/kl_loss": 0.02 + 0.002 * (step % 3),
        "rollout_mismatch/kl_k3": 1e-7,
        "actor/nonfinite_loss_skipped": 0.0,
        "actor/nonfinite_grad_skipped_steps": 0.0,
    }


def run(stream, cfg=None, val=None):
    """Feed `stream(step) -> metrics` for steps 1..len; returns (monitor, {signal: [trip steps]})."""
    mon = HealthMonitor(cfg or HealthConfig())
    trips: dict[str, list[int]] = {}
    if val and 0 in val:  # validation before training
        mon.observe_validation(0, {"val-core/toy/acc/mean@1": val[0]})
    for step, metrics in enumerate(stream, start=1):
        if val and step in val:
            mon.observe_validation(step, {"val-core/toy/acc/mean@1": val[step]})
        out, tripped = mon.observe(step, metrics)
        assert out["health/active"] == sum(out[f"health/{n}/active"] for n in HEALTH_SIGNALS)
        for t in tripped:
            trips.setdefault(t.signal, []).append(t.step)
    return mon, trips


def test_healthy_stream_trips_nothing():
    val = {s: 0.3 + 0.01 * s for s in range(0, 61, 10)}
    _, trips = run([healthy(s) for s in range(1, 61)], val=val)
    assert trips == {}


# ----------------------------------------------------------------------------- signals
def test_entropy_collapse_needs_the_score_stalled_and_not_solved():
    def stream(score):
        for s in range(1, 21):
            m = healthy(s) | {"health/score_mean": score}
            m["actor/entropy"] = 0.8 if s <= 3 else 0.05  # ratio 0.0625 < 0.2 from step 4
            yield m

    # score flat at 0.4: the stall needs 2 x window = 10 steps of score, patience 3 -> step 12
    _, trips = run(stream(0.4))
    assert trips == {"entropy_collapse": [12]}
    _, trips = run(stream(0.95))  # solved (>= 0.9 x best 1.0): a confident right policy
    assert "entropy_collapse" not in trips


def test_identical_responses_with_a_stalled_score_are_an_entropy_collapse():
    def stream(score):
        for s in range(1, 16):
            yield healthy(s) | {"health/score_mean": score(s), "health/identical_share": 0.9}

    _, trips = run(stream(lambda s: 0.4))
    assert trips == {"entropy_collapse": [12]}  # the score trend exists from step 10, patience 3
    _, trips = run(stream(lambda s: 0.2 + 0.02 * s))  # the same answers, but the score still rises
    assert trips == {}


def test_degenerate_output_trips_after_patience_once_per_episode():
    stream = [healthy(s) for s in range(1, 31)]
    for s in range(5, 15):  # steps 5..14 degenerate, then healthy
        stream[s - 1] = stream[s - 1] | {"health/repeat_ngram_rate": 0.8}
    for s in range(25, 31):  # a second episode
        stream[s - 1] = stream[s - 1] | {"health/single_char_share": 0.5}
    mon, trips = run(stream)
    # patience 3: trips at step 7 (5, 6, 7); clears after 5 healthy steps (19); again at 27
    assert trips == {"degenerate_output": [7, 27]}
    assert mon.states["degenerate_output"].episodes == [[7, 19], [27, None]]


def test_length_growth_and_clip():
    stream = []
    for s in range(1, 16):
        m = healthy(s) | {"health/length_mean": 20.0 if s <= 3 else 50.0}
        m["response_length/clip_ratio"] = 0.5 if s >= 10 else 0.0
        stream.append(m)
    _, trips = run(stream)
    # the ratio 50/20 = 2.5 > 2 from step 4, patience 3 -> 6; clip 0.5 > 0.2 from step 10 -> 12
    assert trips["length_growth"] == [6]
    assert trips["length_clip"] == [12]


def test_reward_length_corr_needs_the_length_rising():
    def stream(grow):
        for s in range(1, 11):
            yield healthy(s) | {
                "health/reward_length_corr": 0.9,
                "health/length_mean": 20.0 if s <= 3 or not grow else 40.0,
            }

    _, trips = run(stream(grow=True))
    assert trips.get("reward_length_corr") == [6]
    _, trips = run(stream(grow=False))
    assert "reward_length_corr" not in trips


def test_reward_val_divergence_at_the_validation_that_shows_it():
    stream = [healthy(s) | {"health/score_mean": 0.2 + 0.02 * s} for s in range(1, 31)]
    val = {0: 0.5, 10: 0.45, 20: 0.40, 30: 0.35}
    _, trips = run(stream, val=val)
    # val_window 2: first comparison at the 3rd validation (step 20): train +0.2, val -0.1
    assert trips["reward_val_divergence"] == [20]
    val_ok = {0: 0.3, 10: 0.4, 20: 0.5, 30: 0.6}
    _, trips = run(stream, val=val_ok)
    assert "reward_val_divergence" not in trips


def test_validation_accuracy_prefers_acc_over_reward():
    m = {"val-core/a/reward/mean@1": 0.9, "val-core/a/acc/mean@1": 0.2, "val-core/b/acc/mean@1": 0.4}
    assert validation_accuracy(m) == pytest.approx(0.3)
    assert validation_accuracy({"val-core/a/reward/mean@4": 0.7, "val-aux/x": 1.0}) == 0.7
    assert validation_accuracy({"training/global_step": 3}) is None


def test_tool_call_collapse_while_the_reward_holds():
    def stream(score_after):
        for s in range(1, 16):
            m = healthy(s) | {"agent/tool_call_rate": 0.6 if s <= 3 else 0.05}
            m["health/score_mean"] = 0.5 if s <= 3 else score_after
            yield m

    _, trips = run(stream(0.5))
    assert trips.get("tool_call_collapse") == [6]  # 0.05 / 0.6 <= 0.5 from step 4, patience 3
    _, trips = run(stream(0.1))  # the reward fell with the tool: not a shortcut
    assert "tool_call_collapse" not in trips


def test_rollout_mismatch_median_over_the_window():
    stream = [healthy(s) | {"rollout_mismatch/kl_k3": 1e-7 if s < 8 else 5e-4} for s in range(1, 16)]
    _, trips = run(stream)
    # window 5: the median passes 1e-5 when 3 of the last 5 are high (step 10); patience 3 -> 12
    assert trips == {"rollout_mismatch": [12]}


def test_grad_norm_and_kl_spikes_trip_at_once():
    stream = [healthy(s) for s in range(1, 21)]
    stream[11] = stream[11] | {"actor/grad_norm": 50.0}
    stream[15] = stream[15] | {"actor/kl_loss": 0.5}
    _, trips = run(stream)
    assert trips == {"grad_norm_spike": [12], "kl_spike": [16]}


def test_kl_spike_ignores_tiny_values():
    stream = [healthy(s) | {"actor/kl_loss": 1e-6} for s in range(1, 13)]
    stream[9] = stream[9] | {"actor/kl_loss": 1e-2}  # 10000x the median, but below kl_spike_min
    _, trips = run(stream)
    assert "kl_spike" not in trips


def test_spikes_need_ten_values_of_history():
    stream = [healthy(s) for s in range(1, 12)]
    stream[9] = stream[9] | {"actor/grad_norm": 50.0}  # step 10: only 9 values before it
    _, trips = run(stream)
    assert "grad_norm_spike" not in trips


def test_reward_length_corr_is_not_judged_while_the_tool_rate_rises():
    def stream(tool_rate):
        for s in range(1, 11):
            yield healthy(s) | {
                "health/reward_length_corr": 0.9,
                "health/length_mean": 20.0 if s <= 3 else 40.0,
                "agent/tool_call_rate": tool_rate(s),
            }

    _, trips = run(stream(lambda s: 0.3 if s <= 3 else 0.9))
    assert "reward_length_corr" not in trips
    _, trips = run(stream(lambda s: 0.3))
    assert trips.get("reward_length_corr") == [6]


def test_nonfinite_skips_and_nan_grad_norm():
    stream = [healthy(s) for s in range(1, 12)]
    stream[2] = stream[2] | {"actor/nonfinite_grad_skipped_steps": 1.0}
    stream[9] = stream[9] | {"actor/grad_norm": float("nan")}
    _, trips = run(stream)
    # steps 4-8 are healthy: the first episode clears at step 8, so step 10 is a new one
    assert trips == {"nonfinite": [3, 10]}


def test_dead_signal():
    stream = [healthy(s) | {"health/dead_group_share": 1.0 if s >= 4 else 0.2} for s in range(1, 10)]
    _, trips = run(stream)
    assert trips == {"dead_signal": [6]}


def test_missing_inputs_mean_no_evidence():
    _, trips = run([{"training/global_step": s} for s in range(1, 30)])
    assert trips == {}


def test_trip_message_names_signal_evidence_and_remedies():
    stream = [healthy(s) | {"health/dead_group_share": 1.0} for s in range(1, 5)]
    mon, _ = run(stream)
    msg = mon.trips[0].message()
    assert msg.startswith("health: dead_signal at step 3: 100% of the groups")
    assert "(for 3 steps)" in msg and "usual remedies: lower the learning rate" in msg


def test_state_dict_round_trip_continues_the_episode():
    cfg = HealthConfig()
    stream = [healthy(s) | {"health/dead_group_share": 1.0} for s in range(1, 8)]
    mon, _ = run(stream[:4], cfg)
    resumed = HealthMonitor(cfg)
    resumed.load_state_dict(mon.state_dict())
    for step in range(5, 8):
        _, trips = resumed.observe(step, stream[step - 1])
        assert trips == []  # already tripped at step 3: the same episode
    assert resumed.states["dead_signal"].episodes == [[3, None]]


# ----------------------------------------------------------------------------- batch statistics
def test_repeated_ngram_rate_by_hand():
    r = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 3, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    m = torch.tensor([[1] * 9 + [0], [1] * 10])
    # row 0, n=3: windows 123 231 312 123 231 312 123 -> 7 valid, 3 distinct, 4 repeats
    rates = repeated_ngram_rate(r, m, 3)
    assert rates.tolist() == pytest.approx([4 / 7, 0.0])
    assert repeated_ngram_rate(r[:, :2], m[:, :2], 3).tolist() == [0.0, 0.0]  # shorter than n


def test_single_symbol_rows_tokens_and_characters():
    r = torch.tensor([[7, 7, 7, 0], [8, 9, 8, 9], [3, 4, 3, 4], [5, 6, 5, 6]])
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    assert single_symbol_rows(r, m).tolist() == [True, False, False, False]
    chars = torch.full((10,), -1)
    chars[8], chars[9] = ord("!"), ord("!")  # "!" and "!!"
    chars[3], chars[4] = ord("a"), ord("b")
    assert single_symbol_rows(r, m, chars).tolist() == [True, True, False, False]


def test_duplicate_rows_within_groups_only():
    r = torch.tensor([[1, 2, 0], [1, 2, 0], [1, 2, 9], [1, 2, 0], [3, 3, 3]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 1]])
    groups = torch.tensor([0, 0, 0, 1, 1])
    # rows 0-2 are "1 2" (the masked token does not count); row 3 is in another group
    assert duplicate_rows(r, m, groups).tolist().count(True) == 2
    assert not duplicate_rows(r, m, groups)[3]


def test_batch_stats_dead_groups_and_correlation():
    cfg = dataclasses.replace(HealthConfig(), degenerate_min_tokens=1)
    r = torch.arange(1, 33).reshape(8, 4)
    m = torch.ones(8, 4, dtype=torch.long)
    m[1, 2:] = 0
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5])
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    out = batch_stats(r, m, scores, uids, cfg, best_score=0.0, log_probs=torch.full((8, 4), -0.5))
    # groups a (all 1.0 = the best: solved), b (all 0: dead), c (varies), d (all 0.5 < 0.9: dead)
    assert out["health/dead_group_share"] == pytest.approx(2 / 4)
    assert out["health/best_score"] == 1.0
    assert out["health/entropy_estimate"] == pytest.approx(0.5)
    lengths = m.sum(-1).double()
    expected = float(np.corrcoef(scores.double().numpy(), lengths.numpy())[0, 1])
    assert out["health/reward_length_corr"] == pytest.approx(expected)
    assert out["health/identical_share"] == 0.0 and out["health/single_char_share"] == 0.0


def test_batch_stats_special_ids_do_not_hide_a_repeated_character():
    cfg = dataclasses.replace(HealthConfig(), degenerate_min_tokens=4)
    r = torch.tensor([[5, 5, 5, 5, 2], [5, 6, 7, 8, 2]])  # 2 = eos
    m = torch.ones(2, 5, dtype=torch.long)
    uids = np.array(["a", "b"], dtype=object)
    plain = batch_stats(r, m, torch.zeros(2), uids, cfg, best_score=0.0)
    assert plain["health/single_char_share"] == 0.0
    out = batch_stats(r, m, torch.zeros(2), uids, cfg, best_score=0.0, special_ids=torch.tensor([2]))
    assert out["health/single_char_share"] == 0.5


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"action": "halt"}, ["trainer.health.action='halt'", "save_and_stop"]),
        ({"actions": {"dead": "stop"}}, ["trainer.health.actions key='dead'", "dead_signal"]),
        ({"actions": {"dead_signal": "quit"}}, ["trainer.health.actions.dead_signal='quit'", "warn"]),
        ({"patience": 0}, ["trainer.health.patience=0"]),
        ({"clip_ratio_max": 1.5}, ["trainer.health.clip_ratio_max=1.5"]),
        ({"spike_factor": 0.5}, ["trainer.health.spike_factor=0.5"]),
    ],
)
def test_bad_config_values_name_key_value_and_accepted(kwargs, words):
    with pytest.raises(ValueError) as err:
        HealthConfig(**kwargs)
    for w in words:
        assert w in str(err.value)


def test_action_of_uses_the_per_signal_override():
    cfg = HealthConfig(action="warn", actions={"nonfinite": "save_and_stop"})
    from verl.trainer.ppo.health import action_of

    assert action_of(cfg, "nonfinite") == "save_and_stop" and action_of(cfg, "kl_spike") == "warn"


# ----------------------------------------------------------------------------- what the user sees
def test_console_line_shows_the_health_flag():
    from verl.utils.tracking import format_console_line

    ok = {"critic/score/mean": 0.5, "health/active": 0.0, "health/dead_signal/active": 0.0}
    assert format_console_line(3, ok).endswith("| health ok")
    bad = {"health/active": 2.0, "health/dead_signal/active": 1.0, "health/length_clip/active": 1.0}
    assert format_console_line(4, bad) == "step 4 | health dead_signal,length_clip"
    assert "health" not in format_console_line(5, {"critic/score/mean": 0.5})


def test_report_lists_episodes_warnings_and_the_stop(tmp_path):
    from verl.trainer.ppo.health_report import write_report

    stream = [healthy(s) | {"health/dead_group_share": 1.0 if s >= 4 else 0.2} for s in range(1, 10)]
    mon, _ = run(stream)
    md, png = write_report(mon, str(tmp_path), plot=False, stop_reason="dead_signal tripped at step 6")
    text = open(md).read()
    assert png is None and not (tmp_path / "health.png").exists()
    assert "**The run was stopped:** dead_signal tripped at step 6" in text
    assert "| dead_signal | 6- | 1 (step 9) | above 0.8 | warn |" in text
    assert "| kl_spike | - |" in text
    assert "- health: dead_signal at step 6: 100% of the groups" in text
