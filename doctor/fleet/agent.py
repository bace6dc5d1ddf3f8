"""The torch side of `gpudoctor scan --distributed`: one agent process per rank.

The CLI process never imports torch, so everything that needs torch.distributed runs here, in a
child of the target interpreter started by `gpudoctor.fleet.distributed` (loaded by a bootstrap,
so the target environment needs torch but not gpudoctor). Standard library and torch only.

The agent
- imports torch once, and at once forks the *collective worker* (before any thread, store
  connection or CUDA context exists, so the fork is clean); the worker waits for its plan;
- connects to the store torchrun's rendezvous already runs (a `TCPStore` client at
  MASTER_ADDR:MASTER_PORT; rank 0 hosts one only when torchrun shares none), and keeps a
  heartbeat counter `alive/<rank>` rising every `heartbeat_s` from a thread with its own
  connection: a rank whose counter stops is dead, a rank whose key is missing never started;
- answers the CLI's store requests (set, get what exists, read counters) without ever blocking
  on a key that may never come;
- sends the collective plan to the worker and enforces deadlines on it: a worker that does not
  finish a step in time is killed (its whole session) and the step is `hung`; one that dies is
  `crashed` with its signal. A wedged NCCL or gloo costs one result, never the rank.

The collective worker: an arrival barrier on the store (each rank sets `arrive/<rank>` and waits
for all, giving up early on ranks whose heartbeat stopped), then `init_process_group` (nccl on
CUDA, gloo on the CPU) and its subgroups, a set-up barrier (`ready/<rank>`: no rank measures
until every rank has its groups, so one that fails early cannot break another's set-up), and
the plan's steps: all-reduce and all-to-all at each size, over the
whole world, within each node, and across nodes (one group per local rank: a rail). Before each
step it sets `enter/<step>/<rank>` in the store and after it `done/<step>/<rank>`, so rank 0 can
name ranks that never entered a collective even when they cannot report. Times are medians of
`iterations` runs after a warm-up, synchronised on CUDA.

Protocol with the CLI: JSON lines; the first line on stdin is the configuration, then commands;
answers go to a private copy of stdout (fd 1 is pointed at stderr so that library prints cannot
corrupt it). EOF on stdin ends the agent and its worker.

Fault injection for tests (environment, RANK[,RANK...]): GPUDOCTOR_FAULT_HANG (the worker hangs
inside its first measured collective), GPUDOCTOR_FAULT_CRASH (it dies there with SIGSEGV) and
GPUDOCTOR_FAULT_SETUP (its set-up fails once its groups exist).
"""
from __future__ import annotations

import datetime
import json
import os
import select
import signal
import statistics
import sys
import threading
import time
from typing import Any, Callable

Emit = Callable[[dict], None]


def _faulty(name: str, rank: int) -> bool:
    value = os.environ.get(name, "")
    return str(rank) in [v.split(":")[0].strip() for v in value.split(",") if v.strip()]


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:500] if text else ''}".rstrip(": ")


def _store(dist: Any, config: dict[str, Any], master: bool = False) -> Any:
    return dist.TCPStore(
        config["master_addr"], int(config["master_port"]), is_master=master,
        timeout=datetime.timedelta(seconds=float(config["store_timeout"])), wait_for_workers=False,
    )


# --- the collective worker ---------------------------------------------------------------------


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(torch: Any, dist: Any, op: str, group: Any, n: int, nbytes: int, device: Any,
             iterations: int, timeout: datetime.timedelta) -> float:
    numel = max(n, nbytes // 4 // n * n)  # float32; all-to-all splits it evenly
    x = torch.ones(numel, dtype=torch.float32, device=device)
    out = torch.empty_like(x) if op == "all_to_all" else None

    def once() -> None:
        # Each collective waits at most `timeout` (the group's own timeout is the longer set-up one).
        if op == "all_reduce":
            work = dist.all_reduce(x, group=group, async_op=True)
        else:
            work = dist.all_to_all_single(out, x, group=group, async_op=True)
        work.wait(timeout=timeout)

    once()  # warm-up: connections, buffers, algorithm choice
    _sync(torch, device)
    times = []
    for _ in range(max(1, iterations)):
        start = time.perf_counter()
        once()
        _sync(torch, device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _wait_all(store: Any, plan: dict[str, Any], key: str, timeout: float) -> tuple[list[int], list[int], float]:
    """Wait on the store until every rank has set `<key>/<rank>`, giving up at `timeout` seconds
    or as soon as a missing rank's heartbeat has stopped for `liveness_s`. Returns the ranks still
    missing, those of them whose heartbeat stopped, and the seconds waited."""
    rank, world = plan["rank"], plan["world_size"]
    prefix = plan["prefix"]
    started = time.monotonic()
    deadline = started + timeout
    pending = [r for r in range(world) if r != rank]
    seen: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat, when it last moved)
    while pending:
        pending = [r for r in pending if not store.check([f"{prefix}{key}/{r}"])]
        if not pending:
            break
        now = time.monotonic()
        dead = []
        for r in pending:
            beat = store.add(f"{prefix}alive/{r}", 0)
            last = seen.get(r)
            if last is None or last[0] != beat:
                seen[r] = (beat, now)
            elif now - last[1] > float(plan["liveness_s"]):
                dead.append(r)
        if dead or now > deadline:
            return pending, dead, now - started
        time.sleep(0.05)
    return [], [], time.monotonic() - started


def _arrival(dist: Any, store: Any, plan: dict[str, Any], emit: Emit) -> bool:
    """Wait on the store until every rank arrived; names the missing ranks on a timeout or when
    their heartbeat stopped. Returns whether everyone arrived."""
    store.set(f"{plan['prefix']}arrive/{plan['rank']}", repr(time.time()))
    pending, dead, waited = _wait_all(store, plan, "arrive", float(plan["arrival_timeout"]))
    if pending:
        why = (f"no heartbeat for {plan['liveness_s']:g} s" if dead
               else f"not arrived after {plan['arrival_timeout']:g} s")
        emit({"step": "arrival", "status": "failed", "missing": pending, "dead": dead,
              "detail": f"ranks {', '.join(map(str, pending))} did not arrive ({why})", "wait_s": waited})
        return False
    emit({"step": "arrival", "status": "ok", "wait_s": waited})
    return True


def _ready(store: Any, plan: dict[str, Any], ok: bool, emit: Emit) -> bool:
    """The set-up barrier: no rank starts measuring until every rank has its process group and
    subgroups. Without it a rank that fails early in the first collective (a crash) breaks the
    connections a slower rank is still making for its groups, and the slower rank is blamed for
    never entering. Every rank says `ready/<rank>` = ok or failed and waits for the others (a rank
    whose set-up failed too, so that its connections stay open until they are done); a rank whose
    set-up failed reported why in its own `init` event, and the others stop without measuring."""
    prefix = plan["prefix"]
    store.set(f"{prefix}ready/{plan['rank']}", "ok" if ok else "failed")
    pending, dead, waited = _wait_all(store, plan, "ready", float(plan["setup_timeout"]))
    if not ok:
        # Waited all the same: leaving at once would close connections that other ranks are
        # still making to this one, and their set-up would fail because of this rank.
        return False
    failed = [r for r in range(plan["world_size"])
              if r not in pending and store.check([f"{prefix}ready/{r}"]) and store.get(f"{prefix}ready/{r}") == b"failed"]
    if pending or failed:
        emit({"step": "ready", "status": "failed", "missing": pending, "dead": dead, "failed": failed,
              "detail": (f"ranks {', '.join(map(str, pending))} did not finish setting up" if pending
                         else f"set-up failed on ranks {', '.join(map(str, failed))}"), "wait_s": waited})
        return False
    emit({"step": "ready", "status": "ok", "wait_s": waited})
    return True


def run_plan(plan: dict[str, Any], emit: Emit) -> None:
    """The collective worker's work (see the module docstring). Every outcome is emitted; an
    exception in a step ends the plan, because the group may be unusable after it."""
    import torch
    import torch.distributed as dist

    rank = plan["rank"]
    device = torch.device(plan["device"])
    if device.type == "cuda":
        # A timed-out NCCL wait then raises in this process instead of only marking the stream.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        torch.cuda.set_device(device)
    store = _store(dist, plan)
    prefix = plan["prefix"]
    if not _arrival(dist, store, plan, emit):
        return
    try:
        # Set-up (connections, groups) gets the longer timeout: on a loaded machine it is slow.
        timeout = datetime.timedelta(seconds=float(plan["setup_timeout"]))
        per_op = datetime.timedelta(seconds=float(plan["collective_timeout"]))
        started = time.monotonic()
        options: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(plan["backend"], store=dist.PrefixStore(f"{prefix}pg/", store), rank=rank,
                                world_size=plan["world_size"], timeout=timeout, **options)
    except Exception as exc:
        emit({"step": "init", "status": "failed", "detail": _why(exc)})
        _ready(store, plan, False, emit)
        return
    # Every rank creates only the groups it belongs to, in the plan's order (local synchronisation:
    # the other ranks need not take part).
    groups: dict[str, tuple[Any, list[int]]] = {}
    try:
        for step in plan["steps"]:
            scope = step["scope"]
            if scope not in groups:
                mine = next(g for g in step["groups"] if rank in g)
                group = None if scope == "world" else dist.new_group(mine, timeout=timeout, use_local_synchronization=True)
                groups[scope] = (group, mine)
        if _faulty("GPUDOCTOR_FAULT_SETUP", rank):
            raise RuntimeError("injected set-up failure")
    except Exception as exc:
        emit({"step": "init", "status": "failed", "detail": f"new_group: {_why(exc)}"})
        _ready(store, plan, False, emit)
        return
    emit({"step": "init", "status": "ok", "time_s": time.monotonic() - started, "backend": plan["backend"]})
    if not _ready(store, plan, True, emit):
        return
    for index, step in enumerate(plan["steps"]):
        name = step["name"]
        group, members = groups[step["scope"]]
        store.set(f"{prefix}enter/{name}/{rank}", repr(time.time()))
        emit({"enter": name})
        if index == 0 and _faulty("GPUDOCTOR_FAULT_HANG", rank):
            while True:  # a wedged kernel: entered, never returns, never errors
                time.sleep(3600)
        if index == 0 and _faulty("GPUDOCTOR_FAULT_CRASH", rank):
            os.kill(os.getpid(), signal.SIGSEGV)
        result: dict[str, Any] = {"step": name, "ranks": members}
        try:
            seconds = _measure(torch, dist, step["op"], group, len(members), int(step["bytes"]), device,
                               int(plan["iterations"]), per_op)
            result.update(status="ok", time_s=seconds)
        except Exception as exc:
            result.update(status="failed", detail=_why(exc))
        store.set(f"{prefix}done/{name}/{rank}", json.dumps(result))
        emit(result)
        if result["status"] != "ok":
            return


def _worker_main(read_fd: int, write_fd: int) -> None:
    """The forked collective worker: waits for its plan, runs it, exits without teardown (a
    process group destroyed mid-failure can abort in its destructor)."""
    os.setsid()  # its own session: the agent kills everything it started in one go
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    out = os.fdopen(write_fd, "w", buffering=1)

    def emit(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        with os.fdopen(read_fd, "r") as fh:
            line = fh.readline()
        if line:
            run_plan(json.loads(line), emit)
    except BaseException as exc:  # anything: said once, then gone
        try:
            emit({"step": "worker", "status": "failed", "detail": _why(exc)})
        except Exception:
            pass
    finally:
        try:
            out.flush()
        except Exception:
            pass
        os._exit(0)


class _Worker:
    def __init__(self) -> None:
        plan_r, plan_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(plan_w)
            os.close(out_r)
            _worker_main(plan_r, out_w)
        os.close(plan_r)
        os.close(out_w)
        self.pid, self.plan_fd, self.out_fd = pid, plan_w, out_r
        self.buffer = b""
        self.status: int | None = None

    def kill(self) -> None:
        for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        self.reap(5.0)

    def reap(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return self.status

    def run(self, plan: dict[str, Any], emit: Emit) -> None:
        """Send the plan; forward the worker's events; enforce the deadlines."""
        os.write(self.plan_fd, (json.dumps(plan) + "\n").encode())
        os.close(self.plan_fd)
        step = "arrival"
        step_deadline = time.monotonic() + float(plan["arrival_timeout"]) + float(plan["grace_s"])
        entered = time.monotonic()
        while True:
            timeout = step_deadline - time.monotonic()
            if timeout <= 0:
                self.kill()
                emit({"step": step, "status": "hung",
                      "detail": f"no answer {time.monotonic() - entered:.1f} s after entering {step}: the worker was killed"})
                return
            ready, _, _ = select.select([self.out_fd], [], [], min(timeout, 1.0))
            if not ready:
                continue
            data = os.read(self.out_fd, 1 << 16)
            if not data:
                status = self.reap(5.0)
                if status is not None and os.WIFSIGNALED(status):
                    sig = signal.Signals(os.WTERMSIG(status)).name
                    emit({"step": step, "status": "crashed", "signal": sig,
                          "detail": f"the collective worker was killed by {sig} in {step}"})
                emit({"worker": "exited"})
                return
            self.buffer += data
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if "enter" in event:
                    step = str(event["enter"])
                    entered = time.monotonic()
                    step_deadline = entered + float(plan["collective_timeout"]) + float(plan["grace_s"])
                    continue
                if (event.get("step") == "arrival" and event.get("status") == "ok") or event.get("step") == "init":
                    # set-up, then the barrier after it (a failed rank waits there too): each gets
                    # the set-up timeout
                    step = "init" if event["step"] == "arrival" else "ready"
                    entered = time.monotonic()
                    step_deadline = entered + float(plan["setup_timeout"]) + float(plan["grace_s"])
                emit(event)


# --- the agent ---------------------------------------------------------------------------------


class _Heartbeat(threading.Thread):
    def __init__(self, dist: Any, config: dict[str, Any]) -> None:
        super().__init__(name="gpudoctor-heartbeat", daemon=True)
        self.store = _store(dist, config)
        self.key = f"{config['prefix']}alive/{config['rank']}"
        self.interval = float(config["heartbeat_s"])
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.store.add(self.key, 1)
            except Exception:
                pass  # the store may be gone at the end of the job; the CLI decides what that means
            self.stop.wait(self.interval)


def _serve(store: Any, prefix: str, command: dict[str, Any]) -> dict[str, Any]:
    cmd = command.get("cmd")
    if cmd == "set":
        store.set(prefix + command["key"], command["value"])
        return {"ok": True}
    if cmd == "get":
        values = {}
        for key in command["keys"]:
            full = prefix + key
            values[key] = store.get(full).decode("utf-8", "replace") if store.check([full]) else None
        return {"values": values}
    if cmd == "counters":
        return {"values": {key: int(store.add(prefix + key, 0)) for key in command["keys"]}}
    return {"error": f"unknown command {cmd!r}"}


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # prints from libraries land on stderr, never on the protocol channel
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        channel.write(json.dumps(obj) + "\n")
        channel.flush()

    config = json.loads(sys.stdin.readline() or "{}")
    started = time.monotonic()
    try:
        import torch
        import torch.distributed as dist
    except BaseException as exc:
        send({"event": "error", "detail": f"cannot import torch.distributed: {_why(exc)}"})
        return
    worker = _Worker()  # before any thread or connection: a clean fork
    try:
        store = _store(dist, config, master=bool(config.get("host_store")))
        heartbeat = _Heartbeat(dist, config)
    except Exception as exc:
        worker.kill()
        send({"event": "error", "detail": f"cannot reach the store at {config.get('master_addr')}:"
                                          f"{config.get('master_port')}: {_why(exc)}"})
        return
    heartbeat.start()
    cuda = False
    try:
        cuda = bool(torch.cuda.is_available()) if config.get("want_cuda") else False
    except Exception:
        cuda = False
    send({"event": "ready", "torch": str(torch.__version__), "cuda": cuda,
          "nccl": bool(dist.is_nccl_available()), "import_s": time.monotonic() - started})
    try:
        for line in sys.stdin:
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if command.get("cmd") == "exit":
                break
            if command.get("cmd") == "comm":
                worker.run(command["plan"], lambda event: send({"event": "comm", **event}))
                send({"event": "comm-done"})
                continue
            try:
                send({"event": "reply", **_serve(store, config["prefix"], command)})
            except Exception as exc:
                send({"event": "reply", "error": _why(exc)})
    finally:
        heartbeat.stop.set()
        if worker.status is None:
            worker.kill()
        channel.flush()
        os._exit(0)  # no interpreter teardown: a store or a process group can abort in destructors


if __name__ == "__main__":
    main()
