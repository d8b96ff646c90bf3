"""E2B's code interpreter on agentenv: stateful Python cells in a Jupyter
kernel inside the sandbox (template ``code-interpreter-v1``, built with
``agentenv template build code-interpreter-v1 --code-interpreter``).

Code written for ``e2b_code_interpreter`` changes one import::

    from agentenv.code_interpreter import Sandbox   # was: from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        sbx.run_code("x = 41")
        print(sbx.run_code("x + 1").text)   # 42

The names are E2B's: ``run_code``, ``create_code_context``,
``list_code_contexts``, ``remove_code_context``, ``restart_code_context``,
``Execution``, ``Result``, ``Logs``, ``ExecutionError``, ``Context``,
``OutputMessage``, ``Chart``. Standard library only.
"""

import json
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Type, TypeVar, Union

from . import exceptions as exc
from ._transport import error_from_http
from .sandbox import Sandbox as _BaseSandbox

DEFAULT_TEMPLATE = "code-interpreter-v1"
JUPYTER_PORT = 49999
DEFAULT_TIMEOUT = 300.0  # seconds a cell may run, as E2B's SDK

S = TypeVar("S", bound="Sandbox")


@dataclass
class OutputMessage:
    """One chunk a cell printed to stdout or stderr."""

    line: str
    timestamp: int  # Unix epoch in nanoseconds
    error: bool = False

    def __str__(self) -> str:
        return self.line


@dataclass
class ExecutionError:
    """The exception a cell raised: its name, value and traceback text."""

    name: str
    value: str
    traceback: str

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "value": self.value, "traceback": self.traceback})


class ChartElement:
    """One element of a chart (a line's label and points, a bar, a wedge,
    a box): its fields as attributes (``label``, ``points``, ``value``,
    ``angle``, ``median``...); ``points`` are ``(x, y)`` tuples."""

    def __init__(self, **fields: Any):
        self._raw = dict(fields)
        for k, v in fields.items():
            if k == "points" and isinstance(v, list):
                v = [tuple(p) for p in v]
            setattr(self, k, v)

    def to_dict(self) -> Dict[str, Any]:
        return self._raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._raw.get('label')!r})"


class Chart:
    """What a matplotlib figure plots, as E2B's ``result.chart``: ``type``
    (``line``, ``scatter``, ``bar``, ``pie``, ``box_and_whisker``,
    ``superchart`` or ``unknown``), ``title``, ``elements`` and, for charts
    with axes, ``x_label``, ``y_label``, ``x_unit``, ``y_unit`` and (line and
    scatter) ``x_scale``, ``x_ticks``, ``x_tick_labels`` and their y twins.
    A superchart's elements are Charts; ``to_dict()`` is the JSON."""

    def __init__(self, **fields: Any):
        self._raw = dict(fields)
        self.type = fields.get("type") or "unknown"
        self.title = fields.get("title")
        for k, v in fields.items():
            if k not in ("type", "title", "elements"):
                setattr(self, k, v)
        els = fields.get("elements") or []
        if self.type == "superchart":
            self.elements = [Chart(**e) for e in els]
        else:
            self.elements = [ChartElement(**e) for e in els]

    def to_dict(self) -> Dict[str, Any]:
        return self._raw

    def __repr__(self) -> str:
        return f"Chart({self.type}, {self.title!r})"


_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart")


class Result:
    """One displayed value of a cell: its main result (the last expression)
    or a display call (a chart, a figure). Each representation that the
    kernel produced is set: ``text``, ``html``, ``png`` (base64), ``data``
    (a DataFrame's columns), ..."""

    def __init__(self, is_main_result: bool = False, extra: Optional[Dict[str, Any]] = None, **formats: Any):
        self.is_main_result = bool(is_main_result)
        for f in _FORMATS:
            setattr(self, f, formats.pop(f, None))
        if isinstance(self.chart, dict):
            self.chart = Chart(**self.chart)
        self.extra = dict(extra or {})
        self.extra.update(formats)  # types this SDK does not name

    text: Optional[str]
    html: Optional[str]
    markdown: Optional[str]
    svg: Optional[str]
    png: Optional[str]
    jpeg: Optional[str]
    pdf: Optional[str]
    latex: Optional[str]
    json: Optional[Any]
    javascript: Optional[str]
    data: Optional[Dict[str, Any]]
    chart: Optional["Chart"]

    def formats(self) -> Iterable[str]:
        """The representations present, as E2B lists them."""
        out = [f for f in _FORMATS if f != "text" and getattr(self, f)]
        return out + list(self.extra)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __repr__(self) -> str:
        if self.text:
            return f"Result({self.text})"
        return f"Result(Formats: {', '.join(self.formats())})"

    # Jupyter's rich display hooks, so a Result shows in a notebook.
    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_png_(self) -> Optional[str]:
        return self.png

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown


@dataclass
class Logs:
    """What a cell printed, chunk by chunk."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of one cell: its results, logs, error (None when it ran
    through) and execution count."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the cell's last expression)."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class Context:
    """A code context: its own kernel, language and working directory."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Context":
        return cls(id=d.get("id", ""), language=d.get("language", ""), cwd=d.get("cwd", ""))


OnOutput = Callable[[OutputMessage], Any]


def parse_line(execution: Execution, line: Union[str, bytes], on_stdout: Optional[OnOutput] = None,
               on_stderr: Optional[OnOutput] = None, on_result: Optional[Callable[[Result], Any]] = None,
               on_error: Optional[Callable[[ExecutionError], Any]] = None) -> None:
    """Adds one line of an /execute answer to execution, calling the
    matching callback."""
    msg = json.loads(line)
    kind = msg.pop("type", None)
    now = time.time_ns()
    if kind == "result":
        r = Result(**msg)
        execution.results.append(r)
        if on_result:
            on_result(r)
    elif kind in ("stdout", "stderr"):
        text = msg.get("text", "")
        getattr(execution.logs, kind).append(text)
        cb = on_stdout if kind == "stdout" else on_stderr
        if cb:
            cb(OutputMessage(text, now, kind == "stderr"))
    elif kind == "error":
        execution.error = ExecutionError(msg.get("name", ""), msg.get("value", ""), msg.get("traceback", ""))
        if on_error:
            on_error(execution.error)
    elif kind == "number_of_executions":
        execution.execution_count = msg.get("execution_count")


class Sandbox(_BaseSandbox):
    """An agentenv sandbox with E2B's code interpreter calls; created from
    ``code-interpreter-v1`` unless told otherwise."""

    @classmethod
    def create(cls: Type[S], template: Optional[str] = None, *args: Any, **kwargs: Any) -> S:
        return super().create(template or DEFAULT_TEMPLATE, *args, **kwargs)  # type: ignore[misc]

    def _jupyter(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None,
                 what: str = "") -> Any:
        headers = dict(self._envd.headers)
        headers["E2b-Sandbox-Port"] = str(JUPYTER_PORT)
        headers["Content-Type"] = "application/json"
        data = None if body is None else json.dumps(body).encode()
        t = self._envd.transport
        try:
            return t.request(method, self._envd.base + path, headers, data,
                             timeout=timeout or self._connection_config.request_timeout)
        except exc.TimeoutException:
            raise
        except exc.SandboxException as e:
            raise self._envd.explain(e) from e

    def _check(self, resp: Any, what: str) -> bytes:
        raw = resp.read(what=what)
        if resp.status >= 300:
            raise error_from_http(resp.status, raw, what)
        return raw

    def run_code(self, code: str, language: Optional[str] = None, context: Optional[Context] = None,
                 on_stdout: Optional[OnOutput] = None, on_stderr: Optional[OnOutput] = None,
                 on_result: Optional[Callable[[Result], Any]] = None,
                 on_error: Optional[Callable[[ExecutionError], Any]] = None,
                 envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 request_timeout: Optional[float] = None) -> Execution:
        """Runs code in a kernel that keeps its state between calls: the
        language's default context (Python unless ``language`` says), or
        ``context``. A cell that raises sets ``Execution.error``; a cell
        that runs past ``timeout`` seconds (default 300) is interrupted and
        raises ``TimeoutException``, and the context stays usable."""
        if language and context:
            raise exc.InvalidArgumentException("give language or context, not both")
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        body: Dict[str, Any] = {"code": code, "context_id": context.id if context else None,
                                "language": language, "env_vars": envs}
        # The socket timeout bounds each read; the deadline bounds the cell.
        deadline = time.monotonic() + timeout if timeout else None
        resp = self._jupyter("POST", "/execute", body, timeout=request_timeout or timeout or None)
        if resp.status >= 300:
            self._check(resp, "run_code")
        execution = Execution()
        try:
            for line in _lines(resp, deadline):
                parse_line(execution, line, on_stdout, on_stderr, on_result, on_error)
        except exc.TimeoutException:
            raise exc.TimeoutException(f"the cell ran longer than {timeout} s and was interrupted: "
                                       "pass a larger timeout= to run_code") from None
        finally:
            resp.close()
        return execution

    def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                            request_timeout: Optional[float] = None) -> Context:
        """Starts a new context: its own kernel, in cwd (default /home/user)."""
        body = {"cwd": cwd, "language": language}
        raw = self._check(self._jupyter("POST", "/contexts", body, timeout=request_timeout), "create_code_context")
        return Context.from_json(json.loads(raw))

    def list_code_contexts(self) -> List[Context]:
        """The contexts running in the sandbox, the default ones included."""
        raw = self._check(self._jupyter("GET", "/contexts"), "list_code_contexts")
        return [Context.from_json(d) for d in json.loads(raw) or []]

    def remove_code_context(self, context: Union[Context, str]) -> None:
        """Stops a context's kernel; its variables are gone."""
        cid = context.id if isinstance(context, Context) else context
        self._check(self._jupyter("DELETE", "/contexts/" + urllib.parse.quote(cid, safe="")), "remove_code_context")

    def restart_code_context(self, context: Union[Context, str]) -> None:
        """Replaces a context's kernel with a fresh one (same id and cwd)."""
        cid = context.id if isinstance(context, Context) else context
        self._check(self._jupyter("POST", "/contexts/" + urllib.parse.quote(cid, safe="") + "/restart"),
                    "restart_code_context")


def _lines(resp: Any, deadline: Optional[float]) -> Iterator[bytes]:
    """The lines of a streamed answer as they arrive, until the deadline
    (the server writes a keepalive line every 5 s of silence)."""
    raw = resp._resp
    while True:
        try:
            line = raw.readline(64 << 20)
        except (socket.timeout, TimeoutError):
            raise exc.TimeoutException("deadline passed") from None
        if not line:
            return
        if line.strip():
            yield line
        if deadline is not None and time.monotonic() > deadline:
            raise exc.TimeoutException("deadline passed")


__all__ = ["Chart", "ChartElement", "Context", "Execution", "ExecutionError", "Logs", "OutputMessage", "Result", "Sandbox",
           "DEFAULT_TEMPLATE", "JUPYTER_PORT"]
