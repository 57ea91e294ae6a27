"""The minute at the boundary between the usage database and the recorder's live minute, with an
injected clock and no waiting: a GET /v1/usage that comes right after a minute ended, before the
recorder's thread has observed the sampler again, still counts that minute once (issue: the
report's "adds up" check was off by one minute of 8 GPUs under load)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuctl.daemon.api import ApiRequest
from gpuctl.daemon.usage import UsageService
from gpuctl.daemon.usage_api import install
from gpuctl.daemon.usage_history import fill_simulated_past
from gpuctl.daemon.usage import holds_of
from gpuctl.model import GpuSample

T0 = 1_767_225_600 + 7 * 86400 + 1234.5  # mid-minute, mid-hour


class Clock:
    def __init__(self, t: float):
        self.t = float(t)

    def __call__(self) -> float:
        return self.t


class Sampler:
    """The newest sample of each GPU at the clock's time (what gpuctl.daemon.telemetry.Sampler.latest gives)."""

    def __init__(self, clock: Clock, uuids: list[str]):
        self.clock, self.uuids = clock, uuids

    def latest(self) -> dict[str, GpuSample]:
        return {u: GpuSample(uuid=u, timestamp_s=self.clock(), sm_util_pct=30.0, memory_used_bytes=10,
                             memory_total_bytes=100, process_count=0) for u in self.uuids}


class Api:
    """The part of gpuctl.daemon.api.ControlApi that usage_api.install uses."""

    hostname = "n1"

    def __init__(self):
        self.routes, self.refusal_hooks = {}, []

    def add_route(self, method, path, handler):
        self.routes[(method, path)] = handler

    def get(self, path: str, **query) -> dict:
        status, body = self.routes[("GET", path)](ApiRequest("GET", path, {k: [str(v)] for k, v in query.items()}))
        assert status == 200, body
        return body


GPUS = ["G0", "G1", "G2", "G3"]


@pytest.fixture
def node(tmp_path):
    """A UsageService on an injected clock whose threads never tick on their own (tick_s 1 h): the
    test moves the clock and says when the recorder observes, like the daemon's thread would."""
    clock = Clock(T0)
    state = SimpleNamespace(listeners=[], snapshot=lambda: SimpleNamespace(slices={
        f"{u}/0": SimpleNamespace(gpu_uuid=u, fraction=1.0, department="research" if i % 2 else "unassigned",
                                  lease_id=None) for i, u in enumerate(GPUS)}))
    sampler = Sampler(clock, GPUS)
    service = UsageService(state, sampler, tmp_path, tick_s=3600.0, rollup_every_s=3600.0, clock=clock)
    fill_simulated_past(service.db, holds_of(state.snapshot()), {u: 100 for u in GPUS}, 1, T0 - 2 * 86400, T0)
    service.start(at_s=T0)
    api = Api()
    install(api, service, {u: i for i, u in enumerate(GPUS)})
    try:
        yield SimpleNamespace(clock=clock, service=service, api=api)
    finally:
        service.stop()


def owned_s(api: Api, since: int, until: int) -> float:
    return sum(r["owned_gpu_s"] for r in api.get("/v1/usage", since=since, until=until)["rows"])


def test_minute_just_ended_is_counted_once_before_the_recorder_ticks(node):
    since = int(T0) // 3600 * 3600 - 86400
    # the recorder observes every second up to 0.5 s before a minute's end ...
    end = int(T0) // 60 * 60 + 120
    t = T0
    while t < end - 0.5:
        t = min(t + 1.0, end - 0.5)
        node.clock.t = t
        node.service.recorder.observe(node.service.sampler.latest())
    # ... then the report asks 6 s after the minute ended, before the recorder's next round
    node.clock.t = end + 6
    assert owned_s(node.api, since, end) == pytest.approx(len(GPUS) * (end - since))
    # asked again (the recorder has observed meanwhile): the same figure, no minute counted twice
    node.service.recorder.observe(node.service.sampler.latest())
    assert owned_s(node.api, since, end) == pytest.approx(len(GPUS) * (end - since))
    node.clock.t = end + 30
    node.service.recorder.observe(node.service.sampler.latest())
    assert owned_s(node.api, since, end) == pytest.approx(len(GPUS) * (end - since))


def test_the_past_and_the_live_recording_meet_without_a_gap_or_an_overlap(node):
    """The simulated past ends mid-minute at T0; the recorder starts there: the minute of T0 is
    60 s of each GPU, and every minute around it too."""
    m = int(T0) // 60 * 60
    t = T0
    while t < m + 185:
        t += 1.0
        node.clock.t = t
        node.service.recorder.observe(node.service.sampler.latest())
    for lo in range(m - 120, m + 180, 60):
        assert owned_s(node.api, lo, lo + 60) == pytest.approx(len(GPUS) * 60.0), lo


def test_a_failing_sampler_still_answers_what_is_recorded(node, caplog):
    m = int(T0) // 60 * 60
    node.clock.t = m + 65
    node.service.recorder.observe(node.service.sampler.latest())  # minute m written
    node.service.sampler.latest = lambda: (_ for _ in ()).throw(RuntimeError("sampler stopped"))
    node.clock.t = m + 125
    with caplog.at_level("ERROR", logger="gpuctld.usage"):
        got = owned_s(node.api, m - 60, m + 120)
    # minute m + 60 ended but could not be recorded: the answer is the database as it is
    assert got == pytest.approx(len(GPUS) * 120.0)
    assert "usage: could not record before reading: sampler stopped" in caplog.text
    assert node.service.db.meta("recorded_through_s") == m + 60
