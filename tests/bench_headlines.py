"""What the benchmarks' tests share: the headline each benchmark prints last."""


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def headline(label: str, unit: str, pairs: int) -> str:
    """The last line's pattern: median, range and pairs, maybe "within the noise"."""
    number = r"\d+(\.\d+)?"
    return (rf"{label}: {number}{unit} \({number}–{number}{unit} over {pairs} pairs"
            r"(; within the noise|; spread wider than the effect)?\)")
