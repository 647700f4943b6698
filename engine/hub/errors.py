"""Turns huggingface_hub and network exceptions into one-line UserErrors that say what to do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from engine.errors import UserError

LOGIN_HINT = "run `hf auth login` or set HF_TOKEN"


class DownloadInterrupted(UserError):
    """The connection failed mid-download: a runtime failure (exit 1), not bad input.

    Files that were complete stay in the cache; the one being fetched is discarded, so running
    the same command again continues with what is missing.
    """

    exit_status = 1


class DownloadCorrupt(UserError):
    """A downloaded file did not hash to the digest the Hub lists: a runtime failure (exit 1), as a retry can
    succeed when a proxy or the network altered the bytes. The file is deleted, never placed in the cache."""

    exit_status = 1


class GatedRepo(UserError):
    """The repository needs an accepted licence and a token; `repo_id` says which one."""

    def __init__(self, message: str, repo_id: str) -> None:
        super().__init__(message)
        self.repo_id = repo_id


def hub_url(repo_id: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT}/{repo_id}"


def http_module():
    """huggingface_hub's HTTP client package (httpx2 since huggingface_hub 2, httpx before)."""
    try:
        import httpx2
    except ImportError:  # older huggingface_hub
        import httpx as httpx2
    return httpx2


def translate(exc: BaseException, repo_id: str, filename: str | None = None, revision: str | None = None) -> UserError | None:
    """The UserError for a Hub failure, or None when `exc` is not one we know how to explain."""
    from huggingface_hub import errors

    httpx2 = http_module()

    what = f"{repo_id}/{filename}" if filename else repo_id
    if isinstance(exc, errors.GatedRepoError):
        status = exc.response.status_code if exc.response is not None else 401
        if status == 403:
            return GatedRepo(
                f"{repo_id} is gated and your token has no access yet: accept its licence at {hub_url(repo_id)} "
                "(approval can take a while), then try again",
                repo_id,
            )
        return GatedRepo(f"{repo_id} is gated: accept its licence at {hub_url(repo_id)}, then {LOGIN_HINT}", repo_id)
    if isinstance(exc, errors.RevisionNotFoundError):
        return UserError(f"{repo_id} has no revision {revision!r}: check --revision (a branch, tag or commit)")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return UserError(f"{repo_id} has no file {filename!r} at revision {revision or 'main'}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return UserError(
            f"no model repository {repo_id!r} on the Hub: check the name (if it is private, {LOGIN_HINT})"
        )
    if isinstance(exc, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
        return UserError(
            f"{what} is not in the local cache and the Hub cannot be used (HF_HUB_OFFLINE is set or the network "
            "is down): connect and run `localchat download " + repo_id + "`"
        )
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status == 401:
            return GatedRepo(f"the Hub refused your token (401) for {repo_id}: {LOGIN_HINT} with a valid token", repo_id)
        return DownloadInterrupted(f"the Hub answered HTTP {status} for {what}: try again later")
    if isinstance(exc, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)) or (
        isinstance(exc, OSError) and "Consistency check failed" in str(exc)
    ):
        return DownloadInterrupted(
            f"the connection dropped while downloading {what}: run the same command again to continue "
            "(finished files are kept)"
        )
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout)):
        from huggingface_hub import constants

        # No connection at all is for the user to fix (network, proxy, HF_ENDPOINT, offline mode),
        # like a repository that is not found: status 2 from every command.
        return UserError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({type(exc).__name__}): check the connection, "
            "or set HF_HUB_OFFLINE=1 to use cached models only"
        )
    if isinstance(exc, httpx2.TimeoutException):
        from huggingface_hub import constants

        return DownloadInterrupted(
            f"the Hub at {constants.ENDPOINT} stopped answering ({type(exc).__name__}) for {what}: run the same "
            "command again to continue (finished files are kept)"
        )
    return None


@contextmanager
def hub_errors(repo_id: str, filename: str | None = None, revision: str | None = None) -> Iterator[None]:
    """Re-raise known Hub failures inside the block as one-line UserErrors."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        user_error = translate(exc, repo_id, filename, revision)
        if user_error is None:
            raise
        raise user_error from None
