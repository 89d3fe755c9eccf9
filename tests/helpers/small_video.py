"""The video size of an end-to-end test whose point is not the size: one description for a server job
and for the command line."""

SMALL_JOB = {"size": "64x64", "frames": 5}  # a server job's fields
_WIDTH, _HEIGHT = SMALL_JOB["size"].split("x")
SMALL_GENERATE = (
    "--width",
    _WIDTH,
    "--height",
    _HEIGHT,
    "--frames",
    str(SMALL_JOB["frames"]),
)  # the CLI's flags
