// The MCP conformance suite's test server on the TypeScript SDK: a second server, of another SDK,
// for the suite to reach through toolsearch (tests/system/test_conformance.py).
//
//     node conformance-server.mjs PORT CONTENT.json
//     node conformance-server.mjs stdio CONTENT.json
//
// CONTENT.json is what tests/support/conformance_content.py offers (its tools, their results,
// resources and prompts) as wire JSON; this file adds what each does during a call, as the suite's
// 2025-11-25 server scenarios ask: logs and progress on the call's stream, requests of the client
// (sampling, elicitation) there too, and SSE polling (test_reconnection closes its call's stream
// before the result, which the event store replays to a client that resumes with Last-Event-ID).
// The SDK's Streamable HTTP transport, one per session (GET /healthz answers when it listens); or,
// with `stdio`, one client on its stdin and stdout (for the bridge).
import http from "node:http";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { InMemoryEventStore } from "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js";
import {
  CallToolRequestSchema,
  CompleteRequestSchema,
  CreateMessageResultSchema,
  ElicitResultSchema,
  ErrorCode,
  GetPromptRequestSchema,
  ListPromptsRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListResourcesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
  isInitializeRequest,
} from "@modelcontextprotocol/sdk/types.js";

const [port, contentPath] = [process.argv[2], process.argv[3]];
const content = JSON.parse(readFileSync(contentPath, "utf8"));
const LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];
const ASK_TIMEOUT_MS = 30_000;
const RETRY_MS = 100;
const HOSTS = ["127.0.0.1", "localhost"].map((host) => `${host}:${port}`);
const ANSWERS = { "sampling/createMessage": CreateMessageResultSchema, "elicitation/create": ElicitResultSchema };

const text = (value, isError = false) => ({ content: [{ type: "text", text: value }], ...(isError ? { isError } : {}) });

function build() {
  const server = new Server(
    { name: "mcp-conformance-test-server-ts", version: "1.0.0" },
    { capabilities: { tools: {}, resources: { subscribe: true }, prompts: {}, logging: {}, completions: {} } },
  );
  let level = "debug";
  const log = async (extra, data) => {
    if (LEVELS.indexOf("info") >= LEVELS.indexOf(level)) {
      await extra.sendNotification({ method: "notifications/message", params: { level: "info", logger: "conformance", data } });
    }
  };
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: content.tools }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { name, arguments: args = {} } = request.params;
    if (name in content.results) return content.results[name];
    if (name === "test_error_handling") return text("This tool intentionally returns an error for testing", true);
    if (name === "test_tool_with_logging" || name === "test_logging_tool") {
      for (const message of ["Tool execution started", "Tool processing data", "Tool execution completed"]) {
        await log(extra, message);
      }
      return text("Tool with logging executed successfully");
    }
    if (name === "test_tool_with_progress") {
      const token = request.params._meta?.progressToken;
      for (const progress of [0, 50, 100]) {
        if (token !== undefined) {
          await extra.sendNotification({
            method: "notifications/progress",
            params: { progressToken: token, progress, total: 100, message: `Completed step ${progress} of 100` },
          });
        }
      }
      return text(String(token ?? 0));
    }
    if (name === "test_reconnection") {
      extra.closeSSEStream?.();
      await new Promise((resolve) => setTimeout(resolve, 100));
      return text("Reconnection test completed");
    }
    const asking = content.asking[name];
    if (asking !== undefined) {
      const params = JSON.parse(
        JSON.stringify(asking.params).replaceAll("{argument}", JSON.stringify(String(args[asking.argument] ?? "")).slice(1, -1)),
      );
      let answer;
      try {
        answer = await extra.sendRequest({ method: asking.method, params }, ANSWERS[asking.method], { timeout: ASK_TIMEOUT_MS });
      } catch (error) {
        return text(`${asking.label} not supported or error: ${error.message}`, true);
      }
      if (asking.method === "sampling/createMessage") return text(`LLM response: ${answer.content?.text ?? "No response"}`);
      return text(`${asking.label}: action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`);
    }
    throw new McpError(ErrorCode.InvalidParams, `unknown tool ${name}`);
  });
  server.setRequestHandler(ListResourcesRequestSchema, async () => ({
    resources: content.resources.map(({ contents, ...resource }) => resource),
  }));
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async () => ({ resourceTemplates: content.templates }));
  server.setRequestHandler(ReadResourceRequestSchema, async (request) => {
    const { uri } = request.params;
    const found = content.resources.find((resource) => resource.uri === uri);
    if (found) return { contents: [found.contents] };
    const id = /^test:\/\/template\/([^/]+)\/data$/.exec(uri)?.[1];
    if (id !== undefined) {
      const body = { id, templateTest: true, data: `Data for ID: ${id}` };
      return { contents: [{ uri, mimeType: "application/json", text: JSON.stringify(body) }] };
    }
    throw new McpError(ErrorCode.InvalidParams, "Resource not found", { uri });
  });
  server.setRequestHandler(SubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(UnsubscribeRequestSchema, async () => ({}));
  server.setRequestHandler(ListPromptsRequestSchema, async () => ({ prompts: content.prompts }));
  server.setRequestHandler(GetPromptRequestSchema, async (request) => {
    const messages = content.prompt_messages[request.params.name];
    if (messages === undefined) throw new McpError(ErrorCode.InvalidParams, `unknown prompt ${request.params.name}`);
    const args = request.params.arguments ?? {};
    const filled = JSON.stringify(messages).replace(/\{(\w+)\}/g, (whole, key) =>
      key in args ? JSON.stringify(String(args[key])).slice(1, -1) : (content.prompt_defaults[key] ?? whole),
    );
    return { messages: JSON.parse(filled) };
  });
  server.setRequestHandler(CompleteRequestSchema, async () => ({ completion: { values: [], total: 0, hasMore: false } }));
  server.setRequestHandler(SetLevelRequestSchema, async (request) => {
    level = request.params.level;
    return {};
  });
  return server;
}

const transports = new Map(); // by session id

async function body(request) {
  const chunks = [];
  for await (const chunk of request) chunks.push(chunk);
  const raw = Buffer.concat(chunks).toString("utf8");
  return raw ? JSON.parse(raw) : undefined;
}

// one request of a client: a session's transport answers it, made at the session's initialize
async function serve(request, response) {
  try {
    const url = new URL(request.url, `http://${request.headers.host}`);
    if (url.pathname === "/healthz") return void response.end("ok");
    if (url.pathname !== "/mcp") return void response.writeHead(404).end();
    const sessionId = request.headers["mcp-session-id"];
    const parsed = request.method === "POST" ? await body(request) : undefined;
    let transport = sessionId ? transports.get(sessionId) : undefined;
    if (transport === undefined) {
      if (sessionId || request.method !== "POST" || !isInitializeRequest(parsed)) {
        const error = { code: -32000, message: sessionId ? "Session not found" : "Bad Request: no session" };
        return void response
          .writeHead(sessionId ? 404 : 400, { "content-type": "application/json" })
          .end(JSON.stringify({ jsonrpc: "2.0", id: null, error }));
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        eventStore: new InMemoryEventStore(),
        retryInterval: RETRY_MS,
        enableDnsRebindingProtection: true,
        allowedHosts: HOSTS,
        allowedOrigins: HOSTS.map((host) => `http://${host}`),
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
      await build().connect(transport);
    }
    await transport.handleRequest(request, response, parsed);
  } catch (error) {
    if (!response.headersSent) {
      const answer = { jsonrpc: "2.0", id: null, error: { code: ErrorCode.ParseError, message: String(error) } };
      response.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify(answer));
    }
  }
}

if (port === "stdio") {
  await build().connect(new StdioServerTransport());
} else {
  http.createServer(serve).listen(Number(port), "127.0.0.1");
}
