"""Every independent mistake of one command line is said at once, by the subcommand's own parser, each naming the
flag to change (issue 50, item 4); 00's checks of the parameters' values all together. On main 359bdcc each of
these said only its first mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from kitlib import cli

LINES = [  # (a command line with two or three independent mistakes, what each must name)
    ("plan --hardware Q99 --max-length 0", ["--hardware: unknown profile 'Q99'", "--max-length: '0'", "--model"]),
    ("demo {d}/x --seed -1 --test-fraction 3", ["--seed: '-1'", "--test-fraction: '3'"]),
    ("detect --precision fp99 --bogus", ["--precision: invalid choice: 'fp99'", "unrecognized arguments: --bogus"]),
    ("cache wipe --older-than-days -1", ["action: invalid choice: 'wipe'", "--older-than-days: '-1'"]),
    ("train --bogus", ["the following arguments are required: --work-dir", "unrecognized arguments: --bogus"]),
    ("presets --hardware Q99 --rows 0", ["--hardware: unknown profile 'Q99'", "--rows: '0'"]),
    ("notebooks run --epochs 0x --lr abc", ["--epochs: invalid int value: '0x'", "--lr: invalid float value"]),
    ("notebooks run --data-dir {d} --work-dir {d}/w --epochs 0 --optimizer sgd --hardware Q99",
     ["(--epochs)", "(--optimizer)", "(--hardware)"]),
    ("notebooks run --params {d}/nowhere.json --epochs 0", ["--params", "(--epochs)", "--data-dir DIR is missing"]),
]  # fmt: skip


@pytest.mark.parametrize(("line", "named"), LINES, ids=[line for line, _ in LINES])
def test_every_independent_mistake_is_named_by_the_subcommands_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, named: list[str]
) -> None:
    try:
        code = cli.main(line.format(d=tmp_path).split())
    except SystemExit as stop:  # the subcommand's parser refused the line
        code = int(stop.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    command = line.split()[0]
    said = "notebooks: " if "--epochs 0 " in f"{line} " else f"python -m kitlib {command}: error: "  # 00's checks
    assert said in err, err
    assert all(name in err for name in named), (named, err)
    assert sorted(tmp_path.rglob("*")) == [], "nothing written"


@pytest.mark.parametrize(
    ("values", "named"), [({"hardware": 5}, "hardware = 5 is not"), ({"rehearse": "yes"}, "rehearse")]
)
def test_a_value_its_declaration_refuses_is_not_checked_again_by_what_reads_it(values: dict, named: str) -> None:
    # the hardware profile check read a number's .upper() (AttributeError) after its declaration had named it
    from kitlib.errors import SetupError
    from kitlib.notebook.params import check_parameters

    with pytest.raises(SetupError, match=named):
        check_parameters(values)
