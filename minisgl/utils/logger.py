import logging

from minisgl.env import ENV


def get_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logging.getLogger("minisgl").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s %(name)s] %(levelname)s %(message)s"))
        root = logging.getLogger("minisgl")
        root.addHandler(handler)
        root.setLevel(ENV.log_level.upper())
    return logger
