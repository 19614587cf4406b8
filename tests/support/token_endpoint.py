"""An OAuth 2.0 token endpoint for tests: Token Exchange (RFC 8693) on Authlib, signing ES256 JWTs.

    python -m tests.support.token_endpoint --port PORT --signing-key key.pem --cert c.pem --key c.key

Environment: `SUBJECT_SECRET` verifies the callers' HS256 tokens (the router's secret: the tokens it
accepts are the ones exchanged), `SUBJECT_ISSUER` and `SUBJECT_AUDIENCE` are their `iss` and `aud`;
`CLIENT_ID` and `CLIENT_SECRET` are the one client allowed to exchange (HTTP Basic or the form).

`POST /token` exchanges a subject token for an access token (`typ: at+jwt`, RFC 9068) with the
requested `audience` as `aud`, the caller's `sub`, the requested `scope`, the client as the actor
(`act`), and `exp` `lifetime` seconds away. Authlib answers every refusal as the RFC says:
`invalid_client`, `invalid_grant` (a subject token that does not verify, or whose subject is
revoked), `invalid_scope`, `unsupported_grant_type`. Test controls:

- `POST /control/mode?mode=M`: `normal`; `hang` (the answer never comes); `html` (a 502 HTML page);
  `no_expires_in` (a token without `expires_in`); `POST /control/lifetime?seconds=N`.
- `POST /control/revoke?subject=S`: that subject's tokens are refused with `invalid_grant`.
- `GET /control/exchanges`: `{"exchanges": N, "subjects": [...]}`, the tokens issued, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any
from urllib.parse import parse_qsl

import jwt
import uvicorn
from authlib.oauth2 import AuthorizationServer, OAuth2Request
from authlib.oauth2.rfc6749 import ClientMixin
from authlib.oauth2.rfc6749.errors import InvalidGrantError, InvalidRequestError, UnauthorizedClientError
from authlib.oauth2.rfc6749.grants import BaseGrant, TokenEndpointMixin
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from joserfc.jwk import ECKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

ISSUER = "https://tokens.test"  # the `iss` of the tokens this endpoint issues
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"


class Client(ClientMixin):  # type: ignore[misc]
    def __init__(self, client_id: str, secret: str) -> None:
        self.client_id, self.secret = client_id, secret

    def get_client_id(self) -> str:
        return self.client_id

    def check_client_secret(self, client_secret: str) -> bool:
        return bool(client_secret) and client_secret == self.secret

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in ("client_secret_basic", "client_secret_post")

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == GRANT_TYPE

    def get_allowed_scope(self, scope: str | None) -> str:
        return scope or ""


class Subject:
    """Whom a token is issued for, and to which audience: what the token generator reads."""

    def __init__(self, subject: str, audience: str, actor: str) -> None:
        self.subject, self.audience, self.actor = subject, audience, actor

    def get_user_id(self) -> str:
        return self.subject


class Controls:
    """The endpoint's state: its mode, the lifetime it issues, revoked subjects, what it issued."""

    def __init__(self) -> None:
        self.mode = "normal"
        self.lifetime = 300
        self.revoked: set[str] = set()
        self.issued: list[str] = []


class TokenExchangeGrant(BaseGrant, TokenEndpointMixin):  # type: ignore[misc]
    """RFC 8693 §2.1: a subject token (the caller's) for an access token to an audience."""

    GRANT_TYPE = GRANT_TYPE
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]
    controls: Controls
    subject_key: tuple[str, str, str]  # the callers' secret, issuer and audience

    def validate_token_request(self) -> None:
        client = self.authenticate_token_endpoint_client()
        if not client.check_grant_type(self.GRANT_TYPE):
            raise UnauthorizedClientError()
        data = self.request.payload.data
        if data.get("subject_token_type") != ACCESS_TOKEN or not data.get("subject_token"):
            raise InvalidRequestError("subject_token and subject_token_type (access_token) are required")
        if not data.get("audience"):
            raise InvalidRequestError("audience is required")
        secret, issuer, audience = self.subject_key
        try:
            claims = jwt.decode(
                data["subject_token"], secret, algorithms=["HS256"], issuer=issuer, audience=audience
            )
        except jwt.PyJWTError as exc:
            raise InvalidGrantError(f"the subject token does not verify ({type(exc).__name__})") from None
        if claims["sub"] in self.controls.revoked:
            raise InvalidGrantError("the subject's tokens were revoked")
        self.request.client = client
        self.request.user = Subject(claims["sub"], data["audience"], client.get_client_id())
        self.validate_requested_scope()

    def create_token_response(self) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
        scope = self.request.payload.scope
        token = self.generate_token(user=self.request.user, scope=scope, include_refresh_token=False)
        token["issued_token_type"] = ACCESS_TOKEN
        if self.controls.mode == "no_expires_in":
            del token["expires_in"]
        self.controls.issued.append(self.request.user.subject)
        return 200, token, self.TOKEN_RESPONSE_HEADER


class ExchangeTokens(JWTBearerTokenGenerator):  # type: ignore[misc]
    """ES256 access tokens for the requested audience, with the client as the actor."""

    def __init__(self, key: ECKey, controls: Controls) -> None:
        super().__init__(ISSUER, alg="ES256", expires_generator=lambda client, grant: controls.lifetime)
        self.key = key

    def get_jwks(self) -> ECKey:
        return self.key

    def get_audiences(self, client: Client, user: Subject, scope: str) -> str:
        return user.audience

    def get_extra_claims(self, client: Client, grant_type: str, user: Subject, scope: str) -> dict[str, Any]:
        return {"act": {"sub": user.actor}}


class FormRequest(OAuth2Request):  # type: ignore[misc]
    """A Starlette request whose form was read already, as Authlib's framework integrations make one."""

    def __init__(self, request: Request, form: dict[str, str]) -> None:
        # Starlette's headers: looked up without regard to case, as Authlib's lookups need
        super().__init__(request.method, str(request.url), headers=request.headers)
        self.payload = BasicOAuth2Payload(form)
        self._form = form
        self._args = dict(request.query_params)

    @property
    def form(self) -> dict[str, str]:
        return self._form

    @property
    def args(self) -> dict[str, str]:
        return self._args


class Endpoint(AuthorizationServer):  # type: ignore[misc]
    """Authlib's authorization server, fed a request whose form was read by Starlette."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self.client = client

    def query_client(self, client_id: str) -> Client | None:
        return self.client if client_id == self.client.client_id else None

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        pass  # JWTs: nothing to look up later

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def create_oauth2_request(self, request: OAuth2Request) -> OAuth2Request:
        return request

    def handle_response(self, status: int, body: Any, headers: list[tuple[str, str]]) -> Response:
        return JSONResponse(body, status_code=status, headers=dict(headers))


def build_app(key: ECKey, client: Client, subject_key: tuple[str, str, str]) -> Starlette:
    controls = Controls()
    server = Endpoint(client)
    server.register_token_generator("default", ExchangeTokens(key, controls))
    grant = type("Grant", (TokenExchangeGrant,), {"controls": controls, "subject_key": subject_key})
    server.register_grant(grant)

    async def token(request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode(), keep_blank_values=True))
        if controls.mode == "hang":
            await asyncio.sleep(3600)
        if controls.mode == "html":
            return HTMLResponse("<html><body><h1>502 Bad Gateway</h1></body></html>", status_code=502)
        return server.create_token_response(FormRequest(request, form))  # type: ignore[no-any-return]

    async def mode(request: Request) -> Response:
        controls.mode = request.query_params["mode"]
        return JSONResponse({"mode": controls.mode})

    async def lifetime(request: Request) -> Response:
        controls.lifetime = int(request.query_params["seconds"])
        return JSONResponse({"lifetime": controls.lifetime})

    async def revoke(request: Request) -> Response:
        controls.revoked.add(request.query_params["subject"])
        return JSONResponse({"revoked": sorted(controls.revoked)})

    async def exchanges(request: Request) -> Response:
        return JSONResponse({"exchanges": len(controls.issued), "subjects": controls.issued})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/token", token, methods=["POST"]),
            Route("/control/mode", mode, methods=["POST"]),
            Route("/control/lifetime", lifetime, methods=["POST"]),
            Route("/control/revoke", revoke, methods=["POST"]),
            Route("/control/exchanges", exchanges),
            Route("/healthz", healthz),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--signing-key", required=True, help="PEM of the EC P-256 key tokens are signed with")
    parser.add_argument("--cert", help="PEM certificate to serve TLS with")
    parser.add_argument("--key", help="its key")
    args = parser.parse_args()
    with open(args.signing_key, "rb") as pem:
        key = ECKey.import_key(pem.read())
    client = Client(os.environ["CLIENT_ID"], os.environ["CLIENT_SECRET"])
    subject_key = (os.environ["SUBJECT_SECRET"], os.environ["SUBJECT_ISSUER"], os.environ["SUBJECT_AUDIENCE"])
    app = build_app(key, client, subject_key)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        ssl_certfile=args.cert,
        ssl_keyfile=args.key,
        timeout_graceful_shutdown=1,
    )


if __name__ == "__main__":
    main()
