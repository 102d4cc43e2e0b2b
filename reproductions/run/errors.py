"""One clear line per error: what every ``repro`` command prints when it fails.

A failed command ends with one line on stderr,

    error: <what is wrong, naming the value>; <what is allowed or what to do>

and exits with 2 for a usage error (a bad config or flag value, a missing file named on the
command line, a run directory that must not be overwritten) or 1 for a failure while running
(a non-finite loss, a full disk, a crash); a run stopped by a signal exits with 128 + the
signal's number. No traceback is shown unless asked for: ``--debug`` anywhere on the command
line or ``REPRO_DEBUG=1`` prints it above the line (and is passed on to the processes a command
starts, e.g. a sweep's runs).

What users cause is mostly found by our own constructors (``patch_size=3 does not divide
img_size=8; ...``). jsonargparse wraps those in a long "Does not validate against any of the
Union subtypes ... Given value: Namespace(...)" report; ``describe`` digs the innermost
message raised by this repository's code back out, and turns jsonargparse's own parse errors
(unknown keys, values of the wrong type or not among the choices) into one line naming the key
and the value.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from utils.stop import StopRequested

DEBUG_FLAG = "--debug"
DEBUG_ENV = "REPRO_DEBUG"
REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_LINE = 600


class ReproError(Exception):
    """An error with a message meant for the user, printed as is; ``exit_code`` is the exit status."""

    exit_code = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(ReproError, ValueError):
    """The command line or the config asks for something impossible (exit status 2)."""

    exit_code = 2


class RunFailed(ReproError, RuntimeError):
    """The run started and failed for a reason we can name (exit status 1)."""

    exit_code = 1


class RunInterrupted(ReproError):
    """The run was stopped by a signal (exit status 128 + signal number); ``quiet``: exit without the
    line (a process of a multi-process run other than the first, which says it)."""

    def __init__(self, message: str, *, signum: int | None = None, exit_code: int | None = None,
                 quiet: bool = False) -> None:
        super().__init__(message, exit_code=exit_code if exit_code is not None else 128 + (signum or 2))
        self.signum = signum
        self.quiet = quiet


# ----------------------------------------------------------------------------------- debug switch


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pop_debug_flag(argv: list[str]) -> bool:
    """Remove every ``--debug`` from ``argv`` (in place); True if one was there or REPRO_DEBUG is set.

    The flag is turned into ``REPRO_DEBUG=1`` in this process's environment, so the processes
    a command starts (a sweep's runs, DDP workers) show their tracebacks too.
    """
    found = DEBUG_FLAG in argv
    argv[:] = [a for a in argv if a != DEBUG_FLAG]
    if found:
        os.environ[DEBUG_ENV] = "1"
    return found or debug_enabled()


# ----------------------------------------------------------------------------------- messages


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """``text`` on one line (whitespace collapsed), at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _raised_by_repository(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is a file of this repository."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    path = Path(last.tb_frame.f_code.co_filename)
    if "site-packages" in path.parts or ".venv" in path.parts:
        return False
    try:
        path.resolve().relative_to(REPO_ROOT)
    except ValueError:
        return False
    return True


def own_message(exc: BaseException) -> str | None:
    """The innermost ValueError/TypeError/OSError message raised by this repository's code
    (a constructor's check) in ``exc``'s chain, or a ReproError's message; None if there is none."""
    for e in reversed(exception_chain(exc)):
        if isinstance(e, ReproError):
            return str(e)
        if isinstance(e, (ValueError, TypeError, OSError, KeyError)) and _raised_by_repository(e):
            text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            return text
    return None


_PARSER_KEY = re.compile(r'^\s*Parser key "(?P<key>[^"]+)":\s*(?P<rest>.*)$', re.S)
_UNION_ERRORS = re.compile(r"^\s*- (.+)$", re.M)
_EXPECTED = re.compile(r"Expected a (?P<type>.+?)\. Got value: (?P<value>.*)$", re.S)
_GIVEN = re.compile(r"Given value: (?P<value>.*)$", re.M)
_TYPE_NAMES = {"<class 'int'>": "an integer", "<class 'float'>": "a number", "<class 'bool'>": "true or false",
               "<class 'str'>": "a string", "<class 'NoneType'>": "null"}


def _expected(type_text: str) -> str:
    type_text = type_text.strip()
    literal = re.match(r"typing\.Literal\[(.*)\]$", type_text)
    if literal:
        return "one of " + literal.group(1)
    return _TYPE_NAMES.get(type_text, type_text)


def _key_value_message(key: str, rest: str) -> str:
    """A jsonargparse error about one key as ``--key=value: ...; expected ...``."""
    rest = rest.strip()
    if "Does not validate against any of the Union subtypes" in rest:
        errors = [e.strip() for e in _UNION_ERRORS.findall(rest)]
        given = _GIVEN.search(rest)
        value = given.group("value").strip() if given else "?"
        # our constructors' messages come first; "Expected a <class 'NoneType'>" says nothing
        told = [e for e in errors if not e.startswith("Expected a") and "NoneType" not in e]
        if told:
            return told[0]
        types = [_expected(m.group(1)) for e in errors if (m := re.match(r"Expected an? (.+?)(?:\. Got value: .*)?$", e))]
        if types:
            return f"--{key}={value} is not valid; expected {' or '.join(dict.fromkeys(types))}"
        return f"--{key}={value} is not valid; see --help for what --{key} takes"
    expected = _EXPECTED.match(rest)
    if expected:
        value = expected.group("value").strip()
        return f"--{key}={value} is not valid; expected {_expected(expected.group('type'))}"
    missing = re.match(r"File does not exist: '?(?P<path>[^']*)'?", rest)
    if missing:
        hint = " (an experiment YAML, e.g. reproductions/vit/configs/digits.yaml)" if key == "config" else ""
        return f"--{key} {missing.group('path')}: no such file; give an existing file{hint}"
    first = rest.splitlines()[0] if rest else "invalid value"
    return f"--{key}: {first}"


def parser_message(message: str, options: Iterable[str] = ()) -> str:
    """jsonargparse's error message as one line naming the key and the value."""
    message = str(message).strip()
    m = _PARSER_KEY.match(message)
    if m:
        return _key_value_message(m.group("key"), m.group("rest"))
    unknown = re.match(r"unrecognized arguments: (?P<args>.*)$", message, re.S)
    if unknown:
        args = one_line(unknown.group("args"))
        hint = ""
        options = list(options)
        first = args.split()[0].split("=")[0] if args.split() else ""
        if first.startswith("--") and options:
            close = difflib.get_close_matches(first, options, n=1, cutoff=0.75)
            if close:
                hint = f"did you mean {close[0]}? "
        return f"unrecognized arguments: {args}; {hint}see --help for the options"
    if message.startswith("the following arguments are required"):
        return f"{message}; give an experiment with --config (e.g. reproductions/vit/configs/digits.yaml)"
    required = re.search(r'Key "(?P<key>[^"]+)" is required', message)
    if required:
        return (f"--{required.group('key')} is required; give it, or an experiment config with --config "
                "(e.g. reproductions/vit/configs/digits.yaml)")
    return message.splitlines()[0] if message else "invalid arguments"


_NOT_ACCEPTED = re.compile(r"Option '(?P<option>[^']+)' is not accepted")
_CLASS_PATH = re.compile(r"Problem with given class_path '(?P<path>[^']+)'")
_NESTED_ARG = re.compile(r"NestedArg\(key='(?P<key>[^']*)'")


def _init_arguments(class_path: str) -> list[str]:
    """The keyword arguments a class takes (for "did you mean"), or [] if it cannot be imported."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return []


def _unknown_option(chain: list[BaseException]) -> str | None:
    """``--model.init_args.net.init_args.patchsize`` (a key no class takes) as one line naming the key,
    the class and the closest argument it does take; None if the chain holds no such error."""
    texts = [str(e) for e in chain]
    found = next(((t, m) for t in texts for m in [_NOT_ACCEPTED.search(t)] if m), None)
    if found is None:
        return None
    option = found[1].group("option")
    longest = max(texts, key=len)
    at = longest.find(f"Option '{option}' is not accepted")
    classes = [m.group("path") for m in _CLASS_PATH.finditer(longest[: at if at >= 0 else len(longest)])]
    class_path = classes[-1] if classes else None
    parser_key = next((m.group("key") for t in texts for m in [_PARSER_KEY.match(t)] if m), None)
    nested = next((m.group("key") for t in texts for m in [_NESTED_ARG.search(t)] if m), None)
    if parser_key and nested:
        key = f"{parser_key}.{nested}"
        if ".init_args." not in f".{nested}" and nested.count(".") == 0:
            key = f"{parser_key}.init_args.{nested}"
    elif parser_key:
        key = f"{parser_key}.{option}"
    else:
        key = option
    where = f"not an argument of {class_path}" if class_path else "not an option"
    close = difflib.get_close_matches(option, _init_arguments(class_path), n=1, cutoff=0.6) if class_path else []
    hint = f"did you mean {close[0]}? " if close else ""
    return f"--{key} is {where}; {hint}see --help for the arguments it takes"


def parser_error(exc: BaseException, options: Iterable[str] = ()) -> str:
    """A jsonargparse parse error as one line: for a value nested in classes (``--model.init_args.
    net.init_args.pool max2``) the full key, the value and what is allowed, from the innermost
    error of the chain; a key no class takes, named with the closest one it does; otherwise
    ``parser_message`` of the outermost text."""
    chain = exception_chain(exc)
    unknown = _unknown_option(chain)
    if unknown is not None:
        return unknown
    keys: list[str] = []
    for e in chain:
        m = _PARSER_KEY.match(str(e))
        if m and (not keys or keys[-1] != m.group("key")):
            keys.append(m.group("key"))
    inner = str(chain[-1]).strip()
    expected = _EXPECTED.match(inner)
    if keys and expected:
        path = ".init_args.".join(keys)  # a key inside a class (class_path/init_args) is one level down
        value = expected.group("value").strip()
        kind = expected.group("type").strip()
        literal = re.match(r"typing\.Literal\[(.*)\]$", kind)
        if literal:
            return f"--{path}={value} is not allowed; use one of {literal.group(1)}"
        if len(keys) > 1:
            return f"--{path}={value} is not valid; expected {_expected(kind)}"
    return parser_message(str(exc), options)


def describe(exc: BaseException) -> tuple[str, int]:
    """``(one-line message, exit status)`` for an exception that ends a command."""
    if isinstance(exc, ReproError):  # ours: whole (a resume command must not be cut)
        return one_line(str(exc), limit=10_000), exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C); rerun the same command to start again", 130
    if isinstance(exc, StopRequested):  # a signal (utils/stop.py) that no part of the command turned into its own line
        return f"stopped by {exc.name}; rerun the same command to start again", 128 + exc.signum
    if isinstance(exc, argparse.ArgumentError):  # jsonargparse's parse errors
        return one_line(parser_error(exc)), 2
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return one_line(f"{type(exc).__name__}: {first}; rerun with --debug for the traceback"), 1


def _yaml_error(exc: BaseException):
    """The YAML syntax error (``yaml.MarkedYAMLError``) in ``exc``'s chain, or None."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - jsonargparse needs it
        return None
    return next((e for e in exception_chain(exc) if isinstance(e, yaml.MarkedYAMLError)), None)


def _yaml_problem(error, text: str | None) -> tuple[str, str]:
    """``(what is wrong, what to do)`` for a YAML syntax error, the tab in an indentation named as such."""
    mark = error.problem_mark
    lines = text.splitlines() if text is not None else []
    before = lines[mark.line][: mark.column + 1] if mark is not None and mark.line < len(lines) else ""
    problem = str(error.problem)
    if "'\\t'" in problem or "tab character" in problem or (before.strip() == "" and "\t" in before):
        return ("a tab character where YAML expects spaces (YAML indents with spaces, never tabs)",
                "replace the tab with spaces")
    what = str(error.problem or error.context or "invalid YAML").replace("'<stream end>'", "the end of the file")
    if error.context and error.problem:
        where = error.context_mark
        start = f" that starts at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        what = f"{what} ({error.context}{start})"
    return what, "fix the YAML syntax there (an unclosed bracket or quote, a missing ':' or a bad indentation)"


def yaml_error_line(error, text: str | None, where: str) -> str:
    """One line for a YAML syntax error (``yaml.MarkedYAMLError``) of the file ``where`` (its ``text``
    if known): ``WHERE, line L, column C: what is wrong; what to do``."""
    what, todo = _yaml_problem(error, text)
    mark = error.problem_mark
    at = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
    return one_line(f"{where}, {at}: {what}; {todo}")


def yaml_syntax_message(exc: BaseException, config_files: Sequence[str] = ()) -> str | None:
    """A YAML syntax error in ``exc``'s chain as one line naming the file, line and column and what is wrong
    (``--config bad.yaml, line 2, column 1: a tab character where YAML expects spaces ...; replace the tab with
    spaces``);
    the file is the first of ``config_files`` that fails to load the same way. None if there is no such error."""
    error = _yaml_error(exc)
    if error is None:
        return None
    import yaml

    for name in config_files:
        try:
            text = Path(name).expanduser().read_text()
            yaml.safe_load(text)
        except yaml.MarkedYAMLError as again:
            return yaml_error_line(again, text, f"--config {name}")
        except (OSError, UnicodeDecodeError):
            continue
    return yaml_error_line(error, None, "a config could not be parsed as YAML")


def config_files(argv: Sequence[str]) -> list[str]:
    """The files a command line names with ``--config X`` or ``--config=X``, in order."""
    files = []
    for k, arg in enumerate(argv):
        if arg == "--config" and k + 1 < len(argv):
            files.append(argv[k + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def config_message(exc: BaseException) -> str:
    """What is wrong with a config that could not be parsed or instantiated, as one line: the
    message of this repository's own check if there is one, else jsonargparse's, shortened."""
    own = own_message(exc)
    if own is not None:
        return one_line(own)
    for e in exception_chain(exc):
        if isinstance(e, argparse.ArgumentError) or "Parser key" in str(e) or "Union subtypes" in str(e):
            return one_line(parser_error(e))
    text = str(exc).strip() or type(exc).__name__
    return one_line(f"{type(exc).__name__}: {text.splitlines()[0]}")


# ----------------------------------------------------------------------------------- running


def report(exc: BaseException, *, debug: bool | None = None) -> int:
    """Print the traceback (if debugging) and the one ``error:`` line for ``exc``; return its exit status.
    A process of a multi-process run other than the first stops without a line (``quiet``): the first says it."""
    from utils.process import is_rank_zero
    from utils.stop import noted

    line, code = describe(exc)
    quiet = getattr(exc, "quiet", False)
    if not quiet and noted() is not None and not is_rank_zero():
        # a process other than the first that got the stop too, then failed in a collective whose peer had
        # stopped (gloo: "Connection closed by peer"): a consequence of the stop the first process reports
        quiet, code = True, 128 + noted()
    if quiet and not (debug if debug is not None else debug_enabled()):
        return code
    if debug if debug is not None else debug_enabled():
        traceback.print_exception(exc)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(f"error: {line}", file=sys.stderr, flush=True)
    return code


@contextlib.contextmanager
def argparse_errors() -> Iterator[None]:
    """Within the block, an ``argparse`` parser's error prints its usage and raises UsageError
    (so the dispatcher prints the one ``error:`` line) instead of exiting in argparse."""
    original = argparse.ArgumentParser.error

    def error(self: argparse.ArgumentParser, message: str):
        self.print_usage(sys.stderr)
        raise UsageError(f"{message}; see {self.prog} --help")

    argparse.ArgumentParser.error = error  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def run_command(fn: Callable[[Sequence[str]], int | None], argv: Sequence[str], *, debug: bool = False) -> int:
    """Call ``fn(argv)``; an exception becomes one ``error:`` line and an exit status."""
    try:
        code = fn(argv)
    except SystemExit as e:  # --help, --print_config, or a tool that exits itself
        if type(e).__name__ == "SIGTERMException":  # Lightning's, if it ever gets past the CLI
            return report(RunInterrupted("stopped by SIGTERM", signum=15), debug=debug)
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(f"error: {one_line(str(e.code))}", file=sys.stderr, flush=True)
        return 1
    except BaseException as e:  # noqa: BLE001 - every failure ends in one line
        return report(e, debug=debug)
    return 0 if code is None else int(code)
