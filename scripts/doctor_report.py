"""doctor.py's findings and how they are printed: one Row per check (status, finding, fix lines)
and the table `make doctor` shows (prose wrapped to the terminal, commands kept whole)."""
import shutil
import textwrap

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"


class Row:
    def __init__(self, status, check, finding, fix=()):
        self.status, self.check, self.finding = status, check, finding
        self.fix = [fix] if isinstance(fix, str) else list(fix)


def print_table(rows, header, quiet):
    shown = [r for r in rows if not quiet or r.status in (WARN, FAIL)]
    if not shown:
        return
    width = max(len(r.check) for r in shown) + 2
    indent = " " * (2 + 6 + width)
    # Prose wraps to the terminal; a line that starts with spaces is a command to copy: kept whole.
    cols = max(80, min(shutil.get_terminal_size((110, 24)).columns, 130)) - len(indent)

    def wrap(text, first, more):
        if text.startswith(" "):
            return [first + text]
        lines = textwrap.wrap(text, cols - len(more), break_long_words=False,
                              break_on_hyphens=False)
        return [first + lines[0]] + [indent + more + ln for ln in lines[1:]]

    if header:
        print(header)
    for r in shown:
        out = wrap(r.finding, f"  {r.status:<5} {r.check:<{width}}", "")
        for i, line in enumerate(r.fix):
            out += wrap(line, indent + ("fix: " if i == 0 else "     "), "     ")
        print("\n".join(out))
