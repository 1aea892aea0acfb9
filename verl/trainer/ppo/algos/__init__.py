"""The built-in algorithm functions behind `verl.trainer.ppo.core_algos`, one module per topic.

Import them through `core_algos` (the public surface, as upstream). `core_algos` owns the
registries and registrars and imports these modules last; importing this package first loads
`core_algos`, so a direct `from verl.trainer.ppo.algos.advantages import ...` sees the registrars
defined and every built-in registered.
"""

import verl.trainer.ppo.core_algos  # noqa: F401  (defines the registries, then imports the modules here)
