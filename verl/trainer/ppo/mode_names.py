"""The names of the loss-aggregation modes and KL estimators, without torch.

`core_algos` (through `algos.aggregation` / `algos.kl`) interprets them; the config dataclasses
check user values against the same tuples, and importing torch to compose a config would cost the
CLI ~2 s before the first error message. Part of the algorithms layer.
"""

# agg_loss(loss_agg_mode=...)
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "prompt-mean",
)

# kl_penalty(kl_penalty=...): name -> estimator; a "+" variant gives the named estimator's value
# with k2's gradient (straight-through)
_KL_BASE = {
    "kl": "k1",
    "k1": "k1",
    "abs": "abs",
    "mse": "k2",
    "k2": "k2",
    "low_var_kl": "k3",
    "k3": "k3",
    "full": "full",
}
KL_PENALTY_TYPES = tuple(_KL_BASE) + tuple(f"{k}+" for k in _KL_BASE if k != "full")
