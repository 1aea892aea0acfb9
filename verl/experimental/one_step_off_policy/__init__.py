"""One-step-off-policy training (upstream's entry point): `python -m
verl.experimental.one_step_off_policy.main_ppo`. A preset of the asynchronous trainer
(`verl.trainer.ppo.async_trainer`): see `main_ppo`."""
