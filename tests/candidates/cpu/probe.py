# kbfuse-task: 2/53
# Reports where it runs and stops: its import fails with a message that names its process id,
# working directory and extensions directory, which the verdict's failure message carries.
import os

raise RuntimeError(
    f"probe pid={os.getpid()} cwd={os.getcwd()} "
    f"ext={os.environ.get('TORCH_EXTENSIONS_DIR')} tmp={os.environ.get('TMPDIR')}"
)
