"""Run by every Python kernel the lab starts (see WorkbookKernelManager in jupyter_server_config.py),
so a `%%judge` cell works in a fresh or restarted kernel before the chapter's set-up cell has run.

It runs in the kernel's namespace, so it defines one name and deletes it again.
"""


def _minisgl_register_judge() -> None:
    import sys
    from pathlib import Path

    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    repo = str(Path(__file__).resolve().parent.parent)  # IPython sets __file__ while this file runs

    def judge(line: str, cell: str):
        """%%judge <exercise-id> [--seed N]: grade this cell's code as your answer to the exercise."""
        # Imported at first use: a kernel that never grades never loads the judge. The repository
        # root goes last on the path, as the chapters' set-up puts it.
        if repo not in sys.path:
            sys.path.append(repo)
        from judge.magic import judge_cell

        return judge_cell(line, cell)

    # `book.setup_chapter` registers judge.magic's own function under the same name later
    shell.register_magic_function(judge, magic_kind="cell", magic_name="judge")


_minisgl_register_judge()
del _minisgl_register_judge
