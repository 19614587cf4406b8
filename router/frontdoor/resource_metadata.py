"""OAuth 2.0 Protected Resource Metadata (RFC 9728): how a client finds where to get a token.

In `jwt` mode the router serves its metadata document at `/.well-known/oauth-protected-resource/mcp`
(RFC 9728 §3.1: the well-known prefix before the resource's path, the URL MCP clients try first) and
at `/.well-known/oauth-protected-resource`, and every 401 points at it:
`WWW-Authenticate: Bearer realm="toolsearch", resource_metadata="<url>"` (§5.1). A client that is
refused reads the document, picks one of the authorization servers it names, gets a token there and
sends the request again.

The document, built with the MCP SDK's own model (which clients validate it against):

- `resource`: `router.auth.resource`, or else the URL the request came to (its scheme and Host,
  path `/mcp`; the Host is one the guard in router/frontdoor/origins.py allowed);
- `authorization_servers`: `router.auth.authorization_servers`, or else the issuer, when it is an
  http(s) URL;
- `bearer_methods_supported`: `["header"]`; `scopes_supported`: `router.auth.scopes`, when set.

With no authorization server to name there is no document (404) and 401s carry no pointer.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from mcp.shared.auth import ProtectedResourceMetadata
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from toolsearch.sections.router_settings import RouterAuth

WELL_KNOWN = "/.well-known/oauth-protected-resource"
RESOURCE_PATH = "/mcp"
# A Host value safe to put in a URL and in a quoted challenge parameter; others fall back.
_SAFE_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


class ResourceMetadata:
    """The metadata document of `router.auth`, and the pointer to it that 401s carry."""

    def __init__(self, settings: RouterAuth) -> None:
        self._servers = settings.effective_authorization_servers()
        self._scopes = list(settings.scopes) or None
        self._resource = settings.resource

    @property
    def available(self) -> bool:
        """Whether there is a document to serve: some authorization server to name."""
        return bool(self._servers)

    def resource_for(self, scope: Scope) -> str:
        """This server's resource identifier, as seen by the request in `scope`."""
        if self._resource is not None:
            return self._resource
        host = Headers(scope=scope).get("host", "")
        if not _SAFE_HOST.match(host):
            name, port = scope.get("server") or ("localhost", None)
            name = f"[{name}]" if ":" in str(name) else str(name)
            host = f"{name}:{port}" if port is not None else name
        return f"{scope.get('scheme', 'http')}://{host}{RESOURCE_PATH}"

    def url_for(self, scope: Scope) -> str:
        """The metadata document's URL: the well-known prefix before the resource's path."""
        parts = urlsplit(self.resource_for(scope))
        path = parts.path if parts.path != "/" else ""
        return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{path}"

    def document_for(self, scope: Scope) -> ProtectedResourceMetadata:
        # Validated from plain strings, so the model keeps each URL as configured (no trailing slash
        # added): clients compare an authorization server's issuer with it as a string.
        return ProtectedResourceMetadata.model_validate(
            {
                "resource": self.resource_for(scope),
                "authorization_servers": self._servers,
                "scopes_supported": self._scopes,
                "bearer_methods_supported": ["header"],
            }
        )

    def challenge(self, base: str, scope: Scope) -> str:
        """A 401's `WWW-Authenticate` value with the pointer to the document added."""
        if not self.available:
            return base
        return f'{base}, resource_metadata="{self.url_for(scope)}"'

    async def endpoint(self, request: Request) -> Response:
        document = self.document_for(request.scope)
        return JSONResponse(
            document.model_dump(mode="json", exclude_none=True),
            headers={"Cache-Control": "public, max-age=3600"},
        )

    def routes(self) -> list[Route]:
        """The two well-known routes, or none without a document to serve."""
        if not self.available:
            return []
        methods = ["GET", "HEAD"]
        return [
            Route(WELL_KNOWN, self.endpoint, methods=methods),
            Route(WELL_KNOWN + RESOURCE_PATH, self.endpoint, methods=methods),
        ]
