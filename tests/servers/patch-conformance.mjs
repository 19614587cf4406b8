// The conformance suite imports `globSync` from `fs`, which Node 22 added; on older Node the `glob`
// package gives the same function. Rewrites that one import after every install (npm's postinstall).
import { existsSync, readFileSync, writeFileSync } from "node:fs";

const bundle = new URL("./node_modules/@modelcontextprotocol/conformance/dist/index.js", import.meta.url);
if (existsSync(bundle)) {
  const text = readFileSync(bundle, "utf8");
  const fsImport = /import\{([^}]*)\}from"fs";/;
  const names = text.match(fsImport)?.[1].split(",") ?? [];
  const glob = names.find((name) => name.startsWith("globSync as "));
  if (glob) {
    const rest = names.filter((name) => name !== glob).join(",");
    writeFileSync(bundle, text.replace(fsImport, `import{${glob}}from"glob";import{${rest}}from"fs";`));
  }
}
