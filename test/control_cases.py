"""The small control-loop configuration the fake-clock tests share: 10 ms ticks, 10-action chunks."""
from phyai_ros.control import ControlConfig

MS = 1_000_000
DT = 10 * MS
H = 10


def cfg(**kw) -> ControlConfig:
    base = dict(dt=0.01, horizon=H, action_dim=2, cameras=("front",), state_dim=3, rtc_overlap=2,
                initial_delay_ticks=2)
    base.update(kw)
    return ControlConfig(**base)
