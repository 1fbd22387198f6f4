from .misc import UnknownOptionError, align_down, align_up, div_ceil, default_device, package_has

__all__ = ["UnknownOptionError", "align_down", "align_up", "div_ceil", "default_device", "package_has"]
