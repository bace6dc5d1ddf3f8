"""`gpudoctor scan --distributed` under torchrun: every rank scans its own GPU, the ranks measure
their collectives, and rank 0 writes one fleet report.

    torchrun --nnodes N --nproc-per-node G -m gpudoctor scan --distributed --format json -o fleet.json

Per rank, in this (CLI) process, which never imports torch:

1. start the agent (gpudoctor.fleet.agent) in the target interpreter: it imports torch while the
   scan runs, connects to torchrun's store and starts beating its heartbeat;
2. scan the rank's local device with `gpudoctor.scan.runner.run_scan` (cuda:LOCAL_RANK, or the CPU),
   probes in their own isolated workers as always;
3. have the agent's collective worker run the arrival barrier and the communication steps, each
   under a deadline (see gpudoctor.fleet.agent);
4. publish one record (the scan report, the collective events, timings) under `result/<rank>`.

Rank 0 then gathers the records. A rank that died is a missing key, not a hang: rank 0 waits only
while a rank's heartbeat keeps rising (and at most `exchange_timeout`), reads the enter/done
markers of ranks that never reported, merges everything with `gpudoctor.fleet.merge` plus the
collective findings (`gpudoctor.fleet.collectives`), and writes the report.

Every rank catches its own failures and exits 0 (rank 0: the exit code of the fleet report), so
torchrun does not tear the job down before rank 0 has written. When torchrun does (SIGTERM, after
another rank exited with an error), each rank publishes what it has and rank 0 writes the report
from what arrived within a few seconds, naming the ranks that sent nothing.

Knobs (environment; seconds unless said): GPUDOCTOR_FLEET_TIMEOUT (rank 0's wait for the others'
records, 3600), GPUDOCTOR_ARRIVAL_TIMEOUT (the wait for every rank at the collectives, 1800),
GPUDOCTOR_COLLECTIVE_TIMEOUT (per collective, 60), GPUDOCTOR_LIVENESS (a heartbeat that has not
moved for this long is a dead rank, 30), GPUDOCTOR_COMM_SIZES (bytes per rank, e.g. "1M,256M";
default 1M,256M on GPUs, 64K,1M on the CPU), GPUDOCTOR_COMM_ITERATIONS (5), GPUDOCTOR_LATE_AFTER
(a rank this much later than the first at the collectives is named, 5), GPUDOCTOR_COMM_EXPECT
(fraction of the nominal link bandwidth a collective should reach, 0.5).

Fault injection for tests (RANK[:VALUE], comma-separated): GPUDOCTOR_FAULT_SLOW=RANK:SECONDS (the
rank reaches the collectives that much later), GPUDOCTOR_FAULT_TORCH=RANK:VERSION (the rank's
report claims that torch version), GPUDOCTOR_FAULT_SCAN=RANK (the rank's scan raises),
GPUDOCTOR_FAULT_EXIT=RANK (the rank's process dies after its scan, publishing nothing), and the
agent's GPUDOCTOR_FAULT_HANG / GPUDOCTOR_FAULT_CRASH.
"""
from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gpudoctor
from gpudoctor.fleet.model import ERROR, WARNING, Culprit, FleetFinding
from gpudoctor.reports import load

AGENT_BOOTSTRAP = """\
import sys, importlib.util as u
sys.path[:] = [p for p in sys.path if p not in ('', '.')]
d = sys.argv[1]
s = u.spec_from_file_location('gpudoctor', d + '/__init__.py', submodule_search_locations=[d])
m = u.module_from_spec(s)
sys.modules['gpudoctor'] = m
s.loader.exec_module(m)
import gpudoctor.fleet.agent
gpudoctor.fleet.agent.main()
"""

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class DistributedError(Exception):
    """--distributed cannot run here (exit 2): not under torchrun, or a bad knob."""


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in "KMG" else ""
    number = text[:-1] if unit else text
    try:
        value = int(float(number) * _SIZE_UNITS[unit])
    except ValueError:
        raise DistributedError(f"GPUDOCTOR_COMM_SIZES: {text!r} is not a size (e.g. 64K, 1M, 256M)") from None
    if value <= 0 or value > 16 << 30:
        raise DistributedError(f"GPUDOCTOR_COMM_SIZES: {text!r} is out of range (1 B to 16 GiB)")
    return value


def _env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise DistributedError(f"{name}={text!r}: expected a number") from None
    if not (0 < value < 1e7):
        raise DistributedError(f"{name}={text!r}: must be positive and finite")
    return value


@dataclass(frozen=True)
class DistOptions:
    exchange_timeout: float = 3600.0
    arrival_timeout: float = 1800.0
    collective_timeout: float = 60.0
    liveness_s: float = 30.0
    heartbeat_s: float = 0.5
    sizes: tuple[int, ...] | None = None  # None: by device
    iterations: int = 5
    late_after_s: float = 5.0
    comm_expect_fraction: float = 0.5
    startup_timeout: float = 180.0  # the agent's torch import
    terminate_grace_s: float = 8.0  # after SIGTERM: a rank's wait for its agent; rank 0 waits 1.5x for the others

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DistOptions":
        env = os.environ if environ is None else environ
        sizes = None
        if env.get("GPUDOCTOR_COMM_SIZES"):
            sizes = tuple(parse_size(s) for s in env["GPUDOCTOR_COMM_SIZES"].split(",") if s.strip())
        return cls(
            exchange_timeout=_env_float(env, "GPUDOCTOR_FLEET_TIMEOUT", cls.exchange_timeout),
            arrival_timeout=_env_float(env, "GPUDOCTOR_ARRIVAL_TIMEOUT", cls.arrival_timeout),
            collective_timeout=_env_float(env, "GPUDOCTOR_COLLECTIVE_TIMEOUT", cls.collective_timeout),
            liveness_s=_env_float(env, "GPUDOCTOR_LIVENESS", cls.liveness_s),
            sizes=sizes,
            iterations=int(_env_float(env, "GPUDOCTOR_COMM_ITERATIONS", cls.iterations)),
            late_after_s=_env_float(env, "GPUDOCTOR_LATE_AFTER", cls.late_after_s),
            comm_expect_fraction=_env_float(env, "GPUDOCTOR_COMM_EXPECT", cls.comm_expect_fraction),
        )


@dataclass(frozen=True)
class DistContext:
    """This process's place in a torchrun job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    master_addr: str
    master_port: int
    run_id: str
    restart: int
    agent_store: bool  # torchrun shares its rendezvous store (else rank 0 hosts one)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DistContext":
        env = os.environ if environ is None else environ
        missing = [n for n in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        if missing:
            raise DistributedError(
                "--distributed runs under torchrun (" + ", ".join(missing) + " not set): "
                "torchrun --nnodes N --nproc-per-node G -m gpudoctor scan --distributed; "
                "under Slurm without torchrun, scan each node and `gpudoctor merge` the reports")
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_rank = int(env.get("LOCAL_RANK", "0"))
            local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
            group_rank = int(env.get("GROUP_RANK", str(rank // max(local_world, 1))))
            port = int(env["MASTER_PORT"])
            restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        except ValueError as exc:
            raise DistributedError(f"torchrun's variables are not numbers: {exc}") from None
        if not (0 <= rank < world and 0 <= local_rank < local_world and 0 < port < 65536):
            raise DistributedError(f"inconsistent torchrun variables: RANK={rank} WORLD_SIZE={world} "
                                   f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}")
        return cls(rank, world, local_rank, local_world, group_rank, env["MASTER_ADDR"], port,
                   env.get("TORCHELASTIC_RUN_ID") or "none", restart,
                   env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true")

    @property
    def prefix(self) -> str:
        return f"gpudoctor/{self.run_id}/{self.restart}/"


def _faults(name: str, rank: int) -> str | None:
    """The value of fault `name` for this rank ("" when set without one), or None."""
    for item in os.environ.get(name, "").split(","):
        target, _, value = item.strip().partition(":")
        if target.strip() == str(rank):
            return value.strip()
    return None


class _Terminated(BaseException):
    """SIGTERM/SIGHUP (torchrun tearing the job down): publish what there is and stop."""


class AgentError(Exception):
    pass


class Agent:
    """The agent process and its pipes; every wait has a deadline."""

    def __init__(self, python: str, config: dict[str, Any]) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
        self.proc = subprocess.Popen(
            [python, "-c", AGENT_BOOTSTRAP, gpudoctor.__path__[0]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env, start_new_session=True)
        self.selector = selectors.DefaultSelector()
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ)
        self.buffer = b""
        self.ready: dict[str, Any] | None = None
        self.error: str | None = None
        self._send(config)

    def _send(self, obj: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as exc:
            raise AgentError(f"the agent is gone ({exc})") from None

    def event(self, deadline: float) -> dict[str, Any]:
        while True:
            nl = self.buffer.find(b"\n")
            if nl >= 0:
                line, self.buffer = self.buffer[:nl], self.buffer[nl + 1:]
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    return obj
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError("the agent did not answer in time")
            for key, _ in self.selector.select(min(remaining, 1.0)):
                data = os.read(key.fd, 1 << 20)
                if not data:
                    raise AgentError("the agent exited" + self.tail())
                self.buffer += data

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        if self.ready is None:
            event = self.event(time.monotonic() + timeout)
            if event.get("event") != "ready":
                raise AgentError(str(event.get("detail") or event))
            self.ready = event
        return self.ready

    def request(self, command: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        self._send(command)
        while True:
            event = self.event(time.monotonic() + timeout)
            if event.get("event") == "reply":
                if event.get("error"):
                    raise AgentError(str(event["error"]))
                return event

    def set(self, key: str, value: str) -> None:
        self.request({"cmd": "set", "key": key, "value": value})

    def get(self, keys: list[str]) -> dict[str, str | None]:
        return self.request({"cmd": "get", "keys": keys}, timeout=60 + len(keys) / 100)["values"]

    def counters(self, keys: list[str]) -> dict[str, int]:
        return self.request({"cmd": "counters", "keys": keys}, timeout=60 + len(keys) / 100)["values"]

    def comm(self, plan: dict[str, Any], timeout: float, on_event: Callable[[dict], None]) -> list[dict[str, Any]]:
        self._send({"cmd": "comm", "plan": plan})
        events = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.event(deadline)
            if event.get("event") == "comm-done":
                return events
            if event.get("event") == "comm":
                event = {k: v for k, v in event.items() if k != "event"}
                events.append(event)
                on_event(event)

    def tail(self, limit: int = 600) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - limit))
            lines = [ln for ln in self.stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return f": {lines[-1].strip()}" if lines else ""
        except OSError:
            return ""

    def close(self) -> None:
        try:
            self._send({"cmd": "exit"})
        except AgentError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # and the collective worker, in its session
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self.stderr.close()


def rank_device(requested: str, local_rank: int) -> str:
    """The device a rank scans: its own GPU (cuda:LOCAL_RANK) or the CPU."""
    if requested == "all":
        raise DistributedError("--device all: under --distributed each rank scans its own GPU "
                               "(leave --device out, or give cpu)")
    if requested == "cpu":
        return "cpu"
    if requested == "auto":
        from gpudoctor.scan.environment import nvml_device_count

        if not nvml_device_count():
            return "auto"  # no GPU visible: the runner falls back to the CPU and says why
    if requested in ("auto", "cuda") or requested.startswith("cuda:"):
        return f"cuda:{local_rank}"
    return requested


@dataclass
class RankOutcome:
    rank: int
    fleet: dict[str, Any] | None  # rank 0 only
    error: str | None = None  # why this rank could not take part (it still exits 0)


def run_distributed(options: Any, progress: Callable[[Any], None] | None = None,
                    dist: DistOptions | None = None, merge_options: Any = None,
                    say: Callable[[str], None] | None = None) -> RankOutcome:
    """One rank of a distributed scan (see the module docstring). `options` is the
    `gpudoctor.scan.runner.ScanOptions` given on the command line; it applies to every rank."""
    from gpudoctor.scan import runner
    from gpudoctor.fleet.merge import MergeOptions

    ctx = DistContext.from_env()
    dist = dist or DistOptions.from_env()
    merge_options = merge_options or MergeOptions(redact=options.redact)
    say = say or (lambda message: None)
    device = rank_device(options.device, ctx.local_rank)
    python = runner.resolve_python(options.python)
    started = time.monotonic()
    record: dict[str, Any] = {"rank": ctx.rank, "local_rank": ctx.local_rank, "group_rank": ctx.group_rank,
                              "hostname": socket.gethostname(), "device": device}
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated(signal.Signals(signum).name)

    for sig in previous:
        signal.signal(sig, terminated)
    agent: Agent | None = None
    try:
        config = {"rank": ctx.rank, "prefix": ctx.prefix, "master_addr": ctx.master_addr,
                  "master_port": ctx.master_port, "store_timeout": min(dist.liveness_s * 2, 300.0),
                  "heartbeat_s": dist.heartbeat_s, "host_store": ctx.rank == 0 and not ctx.agent_store,
                  "want_cuda": device.startswith("cuda")}
        try:
            agent = Agent(python, config)
        except OSError as exc:
            record["agent_error"] = f"cannot start {python}: {exc}"
        record.update(_scan(options, device, ctx, progress, runner))
        slow = _faults("GPUDOCTOR_FAULT_SLOW", ctx.rank)
        if slow:
            time.sleep(float(slow or 0))
        if _faults("GPUDOCTOR_FAULT_EXIT", ctx.rank) is not None:
            os._exit(70)  # the rank's process dies outright: no record, its heartbeat stops
        if agent is not None:
            try:
                ready = agent.wait_ready(dist.startup_timeout)
                record["agent"] = {k: ready.get(k) for k in ("torch", "cuda", "nccl", "import_s")}
            except AgentError as exc:
                record["agent_error"] = str(exc)
        if agent is not None and "agent_error" not in record:
            backend = "nccl" if device.startswith("cuda") and record["agent"].get("cuda") and record["agent"].get("nccl") else "gloo"
            plan = make_plan(ctx, dist, backend, device if backend == "nccl" else "cpu")
            record["plan"] = plan
            if ctx.rank == 0:
                say(f"measuring collectives ({backend}, {ctx.world_size} ranks)")
            budget = (dist.arrival_timeout + 2 * plan["setup_timeout"]  # set-up, then its barrier
                      + (len(plan["steps"]) + 2) * (dist.collective_timeout + plan["grace_s"]) + 60)
            comm_started = time.monotonic()
            try:
                record["comm"] = agent.comm(plan, budget, lambda event: None)
            except AgentError as exc:
                record["comm"] = [{"step": "agent", "status": "failed", "detail": str(exc)}]
            record["comm_s"] = time.monotonic() - comm_started
            record["published_s"] = time.monotonic() - started
            agent.set(f"result/{ctx.rank}", json.dumps(record, default=str))
        if ctx.rank != 0:
            return RankOutcome(ctx.rank, None, record.get("agent_error"))
        say("gathering the ranks' reports")
        records, markers = _gather(agent, ctx, dist, record)
        fleet = build_fleet(records, markers, ctx, dist, merge_options, record.get("plan"))
        fleet["distributed"] = _timings(records, time.monotonic() - started)
        return RankOutcome(0, fleet)
    except _Terminated as exc:
        # torchrun is tearing the job down because some rank exited with an error. Say so in the
        # store (once the agent is up: it may still be importing torch), so that rank 0 can tell
        # the victims from the rank that sent nothing, and stop.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        record["terminated"] = str(exc)
        grace = dist.terminate_grace_s
        if agent is not None:
            try:
                agent.wait_ready(grace)
                agent.set(f"result/{ctx.rank}", json.dumps(record, default=str))
            except AgentError:
                pass
        if ctx.rank != 0:
            return RankOutcome(ctx.rank, None, f"stopped by {exc}")
        short = dataclasses.replace(dist, exchange_timeout=grace * 1.5, liveness_s=grace * 1.5)
        ready = agent is not None and agent.ready is not None
        records, markers = _gather(agent, ctx, short, record) if ready else ({0: record}, {})
        fleet = build_fleet(records, markers, ctx, dist, merge_options, record.get("plan"),
                            note=f"rank 0 was stopped by {exc} (torchrun stops every rank when one exits with an error)")
        return RankOutcome(0, fleet)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if agent is not None:
            agent.close()


def _scan(options: Any, device: str, ctx: DistContext, progress: Any, runner: Any) -> dict[str, Any]:
    """Run this rank's scan; a failure is recorded, never raised (torchrun must not see it)."""
    started = time.monotonic()
    out: dict[str, Any] = {}
    try:
        if _faults("GPUDOCTOR_FAULT_SCAN", ctx.rank) is not None:
            raise RuntimeError("injected scan failure (GPUDOCTOR_FAULT_SCAN)")
        report = runner.run_scan(dataclasses.replace(options, device=device, redact=False),
                                 progress=progress if ctx.rank == 0 else None)
        data = report.to_dict()
        env = data.setdefault("environment", {})
        if not isinstance(env.get("fleet"), dict):
            from gpudoctor.fleet.launch import node_environment

            env["fleet"] = node_environment()
        fake = _faults("GPUDOCTOR_FAULT_TORCH", ctx.rank)
        if fake and isinstance(env.get("torch"), dict):
            env["torch"]["version"] = fake
        out["report"] = data
    except runner.ScanInterrupted as exc:
        # The runner holds SIGTERM/SIGHUP while it scans (it kills its workers first): torchrun
        # tearing the job down is this rank's termination, not a failed scan.
        raise _Terminated(exc.signal_name) from None
    except Exception as exc:  # a scan that cannot run is this rank's result, not the job's end
        out["scan_error"] = f"{type(exc).__name__}: {exc}"
    out["scan_s"] = time.monotonic() - started
    return out


def make_plan(ctx: DistContext, dist: DistOptions, backend: str, device: str) -> dict[str, Any]:
    from gpudoctor.fleet.collectives import build_steps

    sizes = list(dist.sizes or ((1 << 20, 256 << 20) if backend == "nccl" else (64 << 10, 1 << 20)))
    return {
        "rank": ctx.rank, "world_size": ctx.world_size, "local_world_size": ctx.local_world_size,
        "prefix": ctx.prefix, "master_addr": ctx.master_addr, "master_port": ctx.master_port,
        "store_timeout": min(dist.liveness_s * 2, 300.0), "arrival_timeout": dist.arrival_timeout,
        "collective_timeout": dist.collective_timeout, "grace_s": max(5.0, dist.collective_timeout / 2),
        "setup_timeout": max(dist.collective_timeout, 120.0),
        "liveness_s": dist.liveness_s, "iterations": dist.iterations, "backend": backend, "device": device,
        "steps": build_steps(ctx.world_size, ctx.local_world_size, sizes),
    }


def _gather(agent: Agent | None, ctx: DistContext, dist: DistOptions,
            own: dict[str, Any]) -> tuple[dict[int, dict[str, Any] | None], dict[str, dict[int, str]]]:
    """Rank 0: every rank's record, waiting only for ranks that are alive (their heartbeat
    moves) and at most `exchange_timeout`; then the collective markers of those that sent none."""
    records: dict[int, dict[str, Any] | None] = {r: None for r in range(ctx.world_size)}
    records[0] = own
    if agent is None or agent.ready is None:
        return records, {}
    started = time.monotonic()
    beats: dict[int, tuple[int, float]] = {}
    pending = [r for r in range(1, ctx.world_size)]
    try:
        while pending:
            values = agent.get([f"result/{r}" for r in pending])
            for r in list(pending):
                text = values.get(f"result/{r}")
                if text is not None:
                    try:
                        record = load.parse_json(text.encode("utf-8", "replace"), f"rank {r}'s record")
                    except load.ReportError as exc:
                        record = {"rank": r, "scan_error": str(exc)}
                    records[r] = record if isinstance(record, dict) else {"rank": r, "scan_error": "its record is not an object"}
                    pending.remove(r)
            if not pending:
                break
            now = time.monotonic()
            counters = agent.counters([f"alive/{r}" for r in pending])
            alive = []
            for r in pending:
                beat = counters.get(f"alive/{r}", 0)
                last = beats.get(r)
                if last is None or last[0] != beat:
                    beats[r] = (beat, now)
                if now - beats[r][1] <= dist.liveness_s:
                    alive.append(r)
            if not alive or now - started > dist.exchange_timeout:
                break
            time.sleep(0.05 if now - started < 2 else 0.25)
        markers: dict[str, dict[int, str]] = {}
        plan = own.get("plan")
        if pending and plan:
            keys = [f"{kind}/{step['name']}/{r}" for step in plan["steps"] for kind in ("enter", "done") for r in pending]
            keys += [f"arrive/{r}" for r in pending]
            values = agent.get(keys)
            for key, value in values.items():
                if value is not None:
                    kind, _, rest = key.partition("/")
                    name, _, rank = rest.rpartition("/")
                    markers.setdefault(f"{kind}/{name}" if name else kind, {})[int(rank)] = value
        for r in pending:
            records[r] = None
            beat = beats.get(r, (0, 0))[0]
            markers.setdefault("heartbeat", {})[r] = str(beat)
        return records, markers
    except AgentError:
        return records, {}


def _timings(records: dict[int, dict[str, Any] | None], total_s: float) -> dict[str, Any]:
    """Where rank 0's time went: the slowest rank's own scan, and rank 0's collectives once every
    rank had arrived (waiting at the arrival barrier overlaps the slower ranks' scans)."""
    scans = [rec["scan_s"] for rec in records.values() if rec and isinstance(rec.get("scan_s"), (int, float))]
    own = records.get(0) or {}
    collectives = None
    if isinstance(own.get("comm_s"), (int, float)):
        waited = next((e.get("wait_s") for e in own.get("comm") or [] if isinstance(e, dict)
                       and e.get("step") == "arrival" and isinstance(e.get("wait_s"), (int, float))), 0.0)
        collectives = round(own["comm_s"] - waited, 3)
    return {"rank0_total_s": round(total_s, 3), "slowest_scan_s": round(max(scans), 3) if scans else None,
            "rank0_collectives_s": collectives}


def build_fleet(records: dict[int, dict[str, Any] | None], markers: dict[str, dict[int, str]], ctx: DistContext,
                dist: DistOptions, merge_options: Any, plan: dict[str, Any] | None, note: str | None = None) -> dict[str, Any]:
    """The fleet report's dict from the ranks' records (pure: tests call it with made-up records)."""
    from gpudoctor.fleet import collectives
    from gpudoctor.fleet.merge import finish, member_from_report, merge_members

    members = []
    scan_failures: list[tuple[int, str]] = []
    jobs = [(((rec.get("report") or {}).get("environment") or {}).get("fleet") or {}).get("launcher", {}).get("job_id")
            for rec in records.values() if rec and isinstance(rec.get("report"), dict)]
    job_id = max(set(jobs), key=jobs.count) if jobs else ctx.run_id
    for rank in range(ctx.world_size):
        rec = records.get(rank)
        if not rec:
            continue
        report = rec.get("report")
        if isinstance(report, dict):
            try:  # read as `gpudoctor report` reads a file: another rank's report is no more trusted
                load.validate(report, f"rank {rank}'s report")
            except load.ReportError as exc:
                rec = {**rec, "scan_error": str(exc)}
                report = None
        if not isinstance(report, dict):
            report = _stub_report(rec, ctx, job_id)
            if not rec.get("terminated"):  # a rank stopped mid-scan is a victim, said below
                scan_failures.append((rank, str(rec.get("scan_error") or "no report")))
        member = member_from_report(report, f"rank {rank}", len(members))
        if report.get("results") == [] and "torch" not in report.get("environment", {}):
            member.versions = {}  # a stub: nothing to compare
        member.rank = rank if member.rank is None else member.rank
        if member.hostname is None:
            member.hostname = rec.get("hostname")
        members.append(member)
    if not members:
        members.append(member_from_report(_stub_report({"rank": 0}, ctx, job_id), "rank 0", 0))

    def findings_for(node_of: Callable[[int], str | None]) -> list[FleetFinding]:
        out: list[FleetFinding] = []
        for rank, why in scan_failures:
            out.append(FleetFinding("scan-failed", ERROR, f"{node_of(rank) or 'node ?'} rank {rank}: the scan did not run ({why})",
                                    key="scan", culprits=(Culprit(node_of(rank), rank, None, "failed", why),)))
        for rank, rec in records.items():
            if rec and rec.get("agent_error"):
                out.append(FleetFinding("collective-failed", ERROR,
                                        f"{node_of(rank) or 'node ?'} rank {rank}: no collectives ({rec['agent_error']})",
                                        key="agent", culprits=(Culprit(node_of(rank), rank, None, "no agent", rec["agent_error"]),)))
            if rec and rec.get("terminated") and (rank != 0 or not note):
                # A victim of the tear-down, not its cause: a warning, so the cause comes first.
                out.append(FleetFinding("collective-failed", WARNING,
                                        f"{node_of(rank) or 'node ?'} rank {rank} was stopped by {rec['terminated']} before it finished",
                                        key="terminated", culprits=(Culprit(node_of(rank), rank, None, "terminated"),)))
        if note:
            out.append(FleetFinding("collective-failed", WARNING, f"{node_of(0) or 'node ?'} {note}", key="terminated",
                                    culprits=(Culprit(node_of(0), 0, None, "terminated"),)))
        if plan:
            found, section = collectives.analyse(records, plan, markers, node_of, backend=plan.get("backend"),
                                                 late_after_s=dist.late_after_s, expect_fraction=dist.comm_expect_fraction)
            out.extend(found)
            holder["collectives"] = section
        return out

    holder: dict[str, Any] = {}
    report, nodes = merge_members(members, merge_options, (), extra_findings=findings_for)
    report.collectives = holder.get("collectives")
    return finish(report, nodes, members, merge_options.redact)


def _stub_report(rec: dict[str, Any], ctx: DistContext, job_id: str | None) -> dict[str, Any]:
    """A report with no results for a rank whose scan did not run, so that it still counts."""
    return {"results": [], "environment": {"fleet": {"launcher": {
        "kind": "torchrun", "job_id": job_id, "rank": rec.get("rank"), "local_rank": rec.get("local_rank"),
        "world_size": ctx.world_size, "local_world_size": ctx.local_world_size, "node_index": rec.get("group_rank"),
        "num_nodes": (ctx.world_size + ctx.local_world_size - 1) // ctx.local_world_size,
        "hostname": {"name": rec.get("hostname")}}}}}
