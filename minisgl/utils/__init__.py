from .misc import align_down, align_up, div_ceil, default_device, default_model_path, package_has

__all__ = ["align_down", "align_up", "div_ceil", "default_device", "default_model_path", "package_has"]
