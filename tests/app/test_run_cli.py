"""`localchat run`'s system prompt: the chat app's default unless --system says otherwise."""

import json

from app.cli import main


def _prompt_tokens(capsys, *argv: str) -> int:
    assert main(["run", *argv]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["stats"]["prompt_tokens"]


def test_run_answers_under_the_apps_default_system_prompt(tmp_path, tiny_models, capsys, monkeypatch):
    from app.commands import default_system_prompt
    from app.settings import Settings

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    assert default_system_prompt() == Settings().system_prompt  # no settings file: the built-in default
    assert not (tmp_path / "home").exists()  # and run creates none
    common = ["--model", str(tiny_models["llama"]), "--device", "cpu", "--json", "--max-tokens", "2", "Hi there"]
    default = _prompt_tokens(capsys, *common)
    assert default == _prompt_tokens(capsys, "--system", Settings().system_prompt, *common)
    none = _prompt_tokens(capsys, "--system", "", *common)
    assert none < default  # '' sends no system message
    # the user's own default from settings.toml
    from app.paths import AppPaths
    from app.settings import save_settings

    path = AppPaths.resolve().settings_path
    path.parent.mkdir(parents=True)
    save_settings(path, Settings(system_prompt="Answer in French, briefly and kindly, to every question."))
    assert default_system_prompt() == "Answer in French, briefly and kindly, to every question."
    assert _prompt_tokens(capsys, *common) > default
    # a bad value: one line on stderr, and the built-in default
    path.write_text("system_prompt = 5\n")
    capsys.readouterr()
    assert default_system_prompt() == Settings().system_prompt
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "system_prompt" in err and "Traceback" not in err
