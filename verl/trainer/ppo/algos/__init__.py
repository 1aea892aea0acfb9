"""The built-in algorithm functions behind `verl.trainer.ppo.core_algos`, one module per topic.

Import them through `core_algos` (the public surface, as upstream). The registries are in
`registry` (imported by the built-ins, importing none of them); importing this package first loads
`core_algos`, so a direct `from verl.trainer.ppo.algos.advantages import ...` sees every built-in
registered.
"""

import verl.trainer.ppo.core_algos  # noqa: F401  (imports every built-in module here)
