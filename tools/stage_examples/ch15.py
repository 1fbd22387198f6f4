"""Chapter 15: server options parse into the scheduler's config; bad ones are refused."""

from minisgl.server.args import ServerArgs, parse_args

args = parse_args(["--model", "models/tiny-llama", "--port", "3000", "--page-size", "4"])
cfg = args.scheduler
assert args.server.port == 3000 and cfg.engine.model_path == "models/tiny-llama" and cfg.engine.page_size == 4
assert args.model_name == "tiny-llama"
try:
    ServerArgs.from_options(model_path="models/tiny-llama", port=0)
except ValueError as e:
    print("refused:", e)
else:
    raise AssertionError("port 0 was accepted")
