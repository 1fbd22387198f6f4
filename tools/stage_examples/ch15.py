"""Chapter 15: server options parse into the scheduler's config; bad ones are refused."""

from minisgl.server.args import ServerArgs, parse_args

args = parse_args(["--model", "models/tiny-llama", "--port", "3000"])
cfg = args.scheduler_config()
assert args.port == 3000 and cfg.engine.model_path == "models/tiny-llama" and args.model_name == "tiny-llama"
try:
    ServerArgs(model="models/tiny-llama", port=0)
except ValueError as e:
    print("refused:", e)
else:
    raise AssertionError("port 0 was accepted")
