"""Experimental features under upstream's paths (`verl.experimental.agent_loop`)."""
