"""Policy settings (policies/settings.py): what a cluster file or the configuration may set,
and the error that names what is wrong, for everything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.config.core import Config, load_config
from broker.errors import ConfigError
from broker.sim.cluster import cluster_from_data
from broker.sim.engine import Simulation
from broker.sim.types import Trace
from policies.settings import check_config, check_settings

CLASSES = ("critical", "high", "normal", "low")

GOOD: dict[str, dict[str, Any]] = {
    "empty": {},
    "spillway knobs": {"spillway": {"fairshare_tier": 0.7,
                                    "class_weight": {"normal": 2, "low": 1.5},
                                    "long_tier_s": 3600, "order_quantile": 0.9},
                       "relief": {"relief_slowdown": 0, "min_gain_s": 60},
                       "move": {"defrag_min_gain_s": 300}},
    "slurm weights": {"multifactor": {"weight_fairshare": 20000, "max_age_s": 86400}},
    "EASY backfill's relax": {"easy": {"backfill_relax": 0.5}},
    "the predictor's quantile": {"predictor_quantile": 1},
}

# (settings, the start of the error after "here: ")
BAD: dict[str, tuple[Any, str]] = {
    "not a mapping": ([1], "here: must be a mapping; allowed keys: ['"),
    "an unknown section": ({"spilway": {}}, "here: 'spilway' is not a setting; allowed: ["),
    "an unknown knob": ({"spillway": {"fairshare_teir": 1}},
                        "here.spillway: 'fairshare_teir' is not a setting of 'spillway'"),
    "a bundle's name is not a policy's": ({"fcfs": {}}, "here: 'fcfs' is not a setting; "
                                                        "allowed: ["),
    "a spillway knob under another policy": ({"easy": {"fairshare_tier": 1}},
                                             "here.easy: 'fairshare_tier' is not a setting of "
                                             "'easy'; allowed: ['backfill_relax']"),
    "a section that is not a mapping": ({"multifactor": 3}, "here.multifactor: must be a mapping"),
    "a string for a number": ({"spillway": {"fairshare_tier": "high"}},
                              "here.spillway.fairshare_tier: 'high' is not allowed; allowed: "
                              "a number >= 0"),
    "a boolean for a number": ({"relief": {"relief_ratio": True}},
                               "here.relief.relief_ratio: True is not allowed"),
    "a negative number": ({"multifactor": {"weight_age": -1}},
                          "here.multifactor.weight_age: -1 is not allowed; allowed: a number >= 0"),
    "not a number": ({"relief": {"relief_ratio": float("nan")}},
                     "here.relief.relief_ratio: nan is not allowed"),
    "zero where it divides": ({"multifactor": {"max_age_s": 0}},
                              "here.multifactor.max_age_s: 0 is not allowed; allowed: "
                              "a number > 0"),
    "a quantile above 1": ({"predictor_quantile": 1.5},
                           "here.predictor_quantile: 1.5 is not allowed; allowed: a number in "
                           "(0, 1]"),
    "a quantile of 0": ({"spillway": {"order_quantile": 0}},
                        "here.spillway.order_quantile: 0 is not allowed"),
    "class_weight not a mapping": ({"spillway": {"class_weight": [1]}},
                                   "here.spillway.class_weight: must be a mapping of class name"),
    "class_weight of an unknown class": ({"spillway": {"class_weight": {"gold": 1}}},
                                         "here.spillway.class_weight: 'gold' is not a class; "
                                         "allowed: ['critical', 'high', 'normal', 'low']"),
    "class_weight negative": ({"spillway": {"class_weight": {"low": -1}}},
                              "here.spillway.class_weight.low: -1 is not allowed"),
    "a Config value outside a cluster file": ({"grace_s": 5}, "here: 'grace_s' is not a "
                                                              "setting"),
}


@pytest.mark.parametrize("settings", list(GOOD.values()), ids=list(GOOD))
def test_good_settings_pass(settings: dict[str, Any]) -> None:
    assert check_settings(settings, "here", classes=CLASSES) == settings


@pytest.mark.parametrize(("settings", "start"), list(BAD.values()), ids=list(BAD))
def test_bad_settings_say_what_and_where(settings: Any, start: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_settings(settings, "here", classes=CLASSES)
    assert str(info.value).startswith(start)


def test_a_cluster_file_may_set_the_config_values() -> None:
    settings = {"fairshare_half_life_s": 3600, "min_runtime_s": 60, "grace_s": 0}
    assert check_settings(settings, "here", cluster=True) == settings
    with pytest.raises(ConfigError, match=r"here\.min_runtime_s: -1 is not allowed"):
        check_settings({"min_runtime_s": -1}, "here", cluster=True)


def test_the_simulator_applies_a_cluster_files_config_values() -> None:
    cluster = cluster_from_data({"nodes": [{"prefix": "n", "gpus": "2xL4"}], "settings": {
        "fairshare_half_life_s": 3600, "min_runtime_s": 60, "relief": {"relief_ratio": 5}}},
        "c.yaml")
    sim = Simulation(cluster, Trace("empty", 0.0, ()), "spillway", config=Config())
    assert sim.config.fairshare_half_life_s == 3600.0 and sim.config.min_runtime_s == 60.0
    assert sim.config.policy_settings == {"relief": {"relief_ratio": 5}}


def test_the_config_file_is_checked_with_its_own_classes(tmp_path: Path) -> None:
    path = tmp_path / "spillway.yaml"
    path.write_text(yaml.safe_dump({
        "classes": [{"name": "gold", "rank": 1}],
        "default_class": "gold",
        "policy_settings": {"spillway": {"class_weight": {"gold": 2}}}}))
    cfg = check_config(load_config(path, env={}))
    assert cfg.policy_settings == {"spillway": {"class_weight": {"gold": 2}}}
    path.write_text(yaml.safe_dump({"policy_settings": {"spillway": {"tier": 1}}}))
    with pytest.raises(ConfigError, match=r"^config policy_settings\.spillway: 'tier' is not a "
                                          r"setting of 'spillway'; allowed: \["):
        check_config(load_config(path, env={}))
    path.write_text(yaml.safe_dump({"policy": "fifo"}))
    with pytest.raises(ConfigError, match=r"^config policy: 'fifo' is not one of \["):
        check_config(load_config(path, env={}))
