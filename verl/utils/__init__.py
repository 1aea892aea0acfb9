from .config import omega_conf_to_dataclass

__all__ = ["omega_conf_to_dataclass"]
