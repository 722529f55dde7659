"""Operator commands for live DoS decisions: ``forumpulse detect unban VALUE`` and ``forumpulse detect decisions``.

Both talk to the running owner (``forumpulse run --dos``) through its HTTP port first (``POST /fp/unban``,
``GET /fp/decisions``), because the owner holds the live state: the detector's active bans, the decision
stream served to CrowdSec bouncers, and (embedded mode) the store itself.  When no owner answers, or it runs
without ``--dos``, they work on the store and the configured actions directly:

* unban: an ``unban`` row in ``decisions``, a message on ``weblogs.decisions`` (when ``actions.kafka``), and
  ``unban`` on every configured action (nftables / ipset / webhook) -- the set element goes away at once;
* decisions: bans still in force by the wall clock (``created_at + duration_s``) and not lifted by a later
  unban, from the ``decisions`` table.

Output: one JSON object per line.  Exit status 1 on a refused value or when neither the owner nor the store
can be reached.  Misuse: with an owner that has a password (``--password-env`` at ``forumpulse run``), pass the
same ``--password-env``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from forumpulse.detectors.dos import _typer_option


def _settings(config: str | None) -> Any:
    from pathlib import Path

    from forumpulse.pipeline.config import load_settings

    return load_settings(Path(config) if config else None)


def _password(password_env: str | None) -> str | None:
    if not password_env:
        return None
    pw = os.environ.get(password_env)
    if not pw:
        raise SystemExit(f"--password-env {password_env}: the variable is empty or not set")
    return pw


@contextlib.contextmanager
def _quiet_driver() -> Iterator[None]:
    """clickhouse-connect logs ``Unexpected Http Driver Exception`` (a warning, printed on stderr by logging's
    last-resort handler when nothing is configured) before it raises on a refused connection; the refusal is
    expected here and reported in one line by the caller, so its HTTP backend's warnings are held back."""
    lg = logging.getLogger("clickhouse_connect.driver._backend.http_sync")
    level = lg.level
    lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        lg.setLevel(level)


def _open_store(settings: Any, store: str | None, owner: str, password: str | None) -> Any:
    """The store named by ``--store`` / the config; when the owner holds an embedded folder, its endpoint.  It
    must exist already (a mistyped path is an error, not a new empty store: ``StoreLocationError``)."""
    from forumpulse.pipeline.store import StoreBusy, StoreUnavailable, open_store

    url = store or settings.store.url
    try:
        return open_store(url, existing=True)
    except StoreBusy as busy:
        from urllib.parse import urlsplit

        u = urlsplit(owner)
        auth = f"default:{password}@" if password else "default@"
        try:
            with _quiet_driver():
                return open_store(f"clickhouse://{auth}{u.hostname}:{u.port or 8123}/forumpulse")
        except StoreUnavailable:
            # the folder is held by another process, which is not an owner answering at --owner: say both
            raise StoreUnavailable(f"{busy} No owner answers at {owner} either: pass the owner's --owner URL, "
                                   "or stop the process holding the folder.") from None


def unban_direct(value: str, settings: Any, store: Any, reason: str = "manual") -> dict[str, Any]:
    """Unban without an owner: table row, Kafka message, every configured action.

    Kafka: with ``actions.kafka`` the message must be confirmed (else an action error: exit 1).  Otherwise,
    when owners publish (``detectors.live.publish_decisions``, the default) and the decisions topic has had
    deliveries recorded (``decisions_published``: Kafka is in use), it is sent too, and one not confirmed is
    only a note: the next owner start publishes it (``kafka`` in the result: ``published``, ``pending`` or
    ``off``; ``not_needed`` when it was not sent and no ban of the value is within its duration: no later start
    sends it either).  Before, a default configuration never sent a direct unban, so the topic said "banned" until an
    owner started (user trial 42)."""
    import time
    import uuid

    from forumpulse.detectors.actions import build_actions
    from forumpulse.detectors.dos import Decision, KafkaSink, StoreSink, published_recorder
    from forumpulse.detectors.dos_rules import ActionsConfig, DosConfig
    from forumpulse.pipeline.live_detect import (
        active_from_store,
        live_config,
        normalize_value,
        unexpired_ban_values,
    )
    from forumpulse.pipeline.store import sql_string

    v = normalize_value(value)
    cfg = DosConfig.model_validate(settings.detectors.get("dos", {}) or {})
    acfg = ActionsConfig.model_validate(settings.actions or {})
    held = [d for d in active_from_store(store) if d.value == v]
    now = int(time.time() * 1000)
    scope = held[0].scope if held else ("ip" if "/" not in v else "range")
    u = Decision(id=uuid.uuid4().hex, created_at=now, decided_at=now, first_seen=held[0].first_seen if held else now,
                 expires_at=now, site=held[0].site if held else cfg.site, action="unban", value=v, scope=scope,
                 reason=reason, duration_s=0, mode="enforce", origin="forumpulse",
                 evidence={"ban_id": held[0].id if held else None})
    sink = StoreSink(store)  # the unban row first: an error here stops the command (exit 1, nothing claimed)
    sink.emit(u)
    sink.close()
    errors = []
    topic = settings.kafka.decisions_topic
    owners_publish = live_config(settings).publish_decisions
    in_use = False
    if owners_publish and not acfg.kafka:
        try:
            in_use = bool(store.query_rows(
                f"SELECT 1 FROM decisions_published WHERE topic = {sql_string(topic)} LIMIT 1"))
        except Exception:  # a store before migration 0012: nothing recorded
            in_use = False
    # pending: the next owner start sends it -- only while a ban of the value has not run out, by the rule the start
    # applies (unpublished_from_store); an unban of nothing unexpired is sent by no one later (user trial 43:
    # "pending" that never resolved)
    published = "off"
    if owners_publish or acfg.kafka:
        try:
            published = "pending" if v in unexpired_ban_values(store) else "not_needed"
        except Exception:  # the row is written; the answer only describes what happens next
            published = "pending"
    if acfg.kafka or in_use:  # a broker away: an action error (actions.kafka) or a note; the actions still run
        try:
            # confirmed -> decisions_published; unconfirmed, the next owner start publishes it again
            wait = 10.0 if acfg.kafka else 5.0
            kafka = KafkaSink(settings.kafka.bootstrap_servers, topic, flush_timeout_s=wait, close_timeout_s=wait,
                              on_delivered=published_recorder(store, topic))
            kafka.emit(u)
            kafka.close()
            published = "published"
        except Exception as exc:
            if acfg.kafka:
                errors.append(f"kafka {topic}: {exc}")
            else:
                later = "; the next owner start publishes it" if published == "pending" else ""
                print(f"note: kafka {topic}: {exc}{later}", file=sys.stderr)
    for a in build_actions(acfg):
        try:
            a.unban(u)
        except Exception as exc:
            errors.append(f"{getattr(a, 'name', a)}: {exc}")
    return {"unbanned": v, "held": bool(held), "decision": u.to_json(), "via": "store", "kafka": published,
            "action_errors": errors}


def unban_command(
    value: str,
    config: str | None = _typer_option(None, "--config", "-c", help="forumpulse.yaml"),
    owner: str = _typer_option("http://127.0.0.1:8123", "--owner", help="URL of the running owner (forumpulse run)"),
    store: str | None = _typer_option(None, "--store", help="store URL when no owner runs (default: config)"),
    password_env: str | None = _typer_option(None, "--password-env", help="variable holding the owner's password"),
    reason: str = _typer_option("manual", "--reason", help="recorded as the unban's reason"),
) -> None:
    """Lift a ban (address or CIDR): via the running owner, else directly on the store and the firewall."""
    from forumpulse.pipeline.live_detect import OwnerNoAnswer, normalize_value, owner_request

    try:
        normalize_value(value)
    except ValueError as exc:
        print(json.dumps({"error": str(exc)}), file=sys.stderr)
        raise SystemExit(1) from None
    password = _password(password_env)
    try:
        status, body = owner_request(owner, "POST", "/fp/unban", {"value": value, "reason": reason}, password,
                                     timeout=30.0)
    except OwnerNoAnswer as exc:  # not done directly as well: two unbans, two webhook calls (user trial 41)
        print(json.dumps({"error": f"{exc}: it may still lift the ban; not done directly (the owner holds the "
                                   "store): check with forumpulse detect decisions, or try again"}), file=sys.stderr)
        raise SystemExit(1) from None
    except OSError:
        status, body = 0, None  # no owner: work directly
    if status == 200:
        print(json.dumps({**body, "via": "owner"}))
        return
    if status not in (0, 404):
        print(json.dumps({"error": f"owner answered {status}", "detail": body}), file=sys.stderr)
        raise SystemExit(1)
    settings = _settings(config)
    st = _open_store(settings, store, owner, password)
    try:
        out = unban_direct(value, settings, st, reason)
    finally:
        st.close()
    print(json.dumps(out))
    if out["action_errors"]:
        raise SystemExit(1)


def decisions_command(
    config: str | None = _typer_option(None, "--config", "-c", help="forumpulse.yaml"),
    owner: str = _typer_option("http://127.0.0.1:8123", "--owner", help="URL of the running owner (forumpulse run)"),
    store: str | None = _typer_option(None, "--store", help="store URL when no owner runs (default: config)"),
    password_env: str | None = _typer_option(None, "--password-env", help="variable holding the owner's password"),
) -> None:
    """List the active DoS decisions (one JSON object per line, newest first)."""
    from forumpulse.detectors.dos_rules import ActionsConfig
    from forumpulse.pipeline.live_detect import (
        OwnerNoAnswer,
        active_from_store,
        decision_view,
        live_config,
        owner_request,
        spool_state,
        with_published,
    )

    password = _password(password_env)
    try:
        status, body = owner_request(owner, "GET", "/fp/decisions", None, password, timeout=30.0)
    except OwnerNoAnswer as exc:  # the owner holds the store: reading it directly fails anyway
        print(json.dumps({"error": f"{exc}; try again"}), file=sys.stderr)
        raise SystemExit(1) from None
    except OSError:
        status, body = 0, None
    if status == 200:
        rows = list(body)
    elif status in (0, 404):
        settings = _settings(config)
        st = _open_store(settings, store, owner, password)
        try:
            acfg = ActionsConfig.model_validate(settings.actions or {})
            publish = live_config(settings).publish_decisions or acfg.kafka
            rows = with_published([decision_view(d) for d in active_from_store(st)], st,
                                  settings.kafka.decisions_topic if publish else None)
        finally:
            st.close()
        spool = live_config(settings).spool_dir
        waiting = spool_state(spool)[1]
        if waiting:  # no owner ran since they were spooled (user trial 43: the list missed them without a word)
            print(f"note: {waiting} spooled decision file(s) in {spool} are not in the store yet (not listed): the "
                  "next owner start loads them", file=sys.stderr)
    else:
        print(json.dumps({"error": f"owner answered {status}", "detail": body}), file=sys.stderr)
        raise SystemExit(1)
    for r in rows:
        print(json.dumps(r, sort_keys=True))
    if not rows:
        print("note: no bans in force", file=sys.stderr)


if __name__ == "__main__":  # `python -m forumpulse.detectors.dos_cli unban|decisions ...` (before CLI wiring)
    import typer

    _app = typer.Typer()
    _app.command("unban")(unban_command)
    _app.command("decisions")(decisions_command)
    _app()
