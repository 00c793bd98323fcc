from tfrun.in_task import notes


def test_a_note_is_printed_once_per_topic(capsys, monkeypatch):
    monkeypatch.setattr(notes, "_said", set())
    assert notes.say_once("a", "tfrun: first") is True
    assert notes.say_once("a", "tfrun: again") is False
    assert notes.say_once("b", "tfrun: other") is True
    assert capsys.readouterr().err.splitlines() == ["tfrun: first", "tfrun: other"]
