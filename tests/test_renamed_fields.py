"""Renamed config fields (config.RENAMED_FIELDS): a workdir's config.json written under an
old name is read back under the new one, so the run resumes; a config that sets an old name
stops with one line naming the new field."""
import json

import pytest

from fedjax_lama import config as config_lib
from fedjax_lama import training
from fedjax_lama.errors import ConfigError

OLD_NAMES = {"engine.conv_impl": "lax", "local_lr_schedule": "cosine"}


def _old_style(config_dict: dict) -> dict:
  """`config_dict` as a run written before the renames saved it."""
  old = json.loads(json.dumps(config_dict))
  old["engine"]["conv_impl"] = old["engine"].pop("kernels")
  old["local_lr_schedule"] = old.pop("local_lr_decay")
  return old


def test_every_renamed_field_names_a_current_field():
  base = config_lib.base_config()
  for old, new in config_lib.RENAMED_FIELDS.items():
    *parents, key = new.split(".")
    section = base
    for name in parents:
      section = section[name]
    if parents != ["model_options"]:  # the models' options live in models.options()
      assert key in section, new
    assert old != new


def test_rename_old_fields_moves_old_names_and_keeps_the_rest():
  current = training.config_json(config_lib.base_config())
  old = _old_style(current)
  old["engine"]["conv_impl"], old["local_lr_schedule"] = "lax", "step"
  before = json.dumps(old, sort_keys=True)
  renamed = config_lib.rename_old_fields(old)
  assert json.dumps(old, sort_keys=True) == before  # the argument is left as it was
  assert renamed["engine"]["kernels"] == "lax" and "conv_impl" not in renamed["engine"]
  assert renamed["local_lr_decay"] == "step" and "local_lr_schedule" not in renamed
  renamed["engine"]["kernels"], renamed["local_lr_decay"] = "auto", "constant"
  assert renamed == current
  assert config_lib.rename_old_fields(current) == current  # current names: unchanged


def test_rename_old_fields_renames_a_model_option():
  renamed = config_lib.rename_old_fields({"model_options": {"conv_impl": "patches"}})
  assert renamed == {"model_options": {"kernels": "patches"}}


def test_a_workdir_written_under_old_names_resumes(tmp_path):
  config = config_lib.base_config()
  old = _old_style(training.config_json(config))
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert training.check_workdir(str(tmp_path), config) is None  # same run: resumes
  config.engine.kernels = "lax"  # the old run computed with "auto"
  with pytest.raises(ConfigError, match=r"fields: engine\)"):
    training.check_workdir(str(tmp_path), config)


@pytest.mark.parametrize("old,value", sorted(OLD_NAMES.items()))
def test_a_config_setting_an_old_name_stops_naming_the_new_one(old, value):
  c = config_lib.base_config()
  *parents, key = old.split(".")
  section = c
  for name in parents:
    section = section[name]
  section[key] = value
  new = config_lib.RENAMED_FIELDS[old]
  with pytest.raises(ConfigError) as raised:
    config_lib.validate(c)
  message = str(raised.value)
  assert "\n" not in message
  assert f"config.{old} was renamed config.{new}" in message


def test_a_model_option_under_its_old_name_stops_naming_the_new_one():
  c = config_lib.base_config()
  c.model_options.conv_impl = "lax"
  with pytest.raises(ConfigError, match=r"config\.model_options\.conv_impl was renamed "
                     r"config\.model_options\.kernels"):
    config_lib.validate(c)
