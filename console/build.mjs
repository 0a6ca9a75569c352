// Bundles src/ into ../server/postbox_server/console/static (app.js, app.css, index.html), which the
// server ships and serves: no CDN. The output is deterministic, and .ci/run rebuilds it
// and fails when it differs from the committed one.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "server", "postbox_server", "console", "static");

// The stubs (../stubs/ts/gen) import @bufbuild/protobuf: take this project's copy, not
// one that may sit in stubs/ts/node_modules, so that one runtime is bundled, whatever
// else is installed.
const ownRuntime = {
  name: "own-runtime",
  setup(build) {
    build.onResolve({ filter: /^@bufbuild\/protobuf(\/|$)/ }, (args) => {
      if (args.resolveDir === here) return undefined;
      return build.resolve(args.path, { kind: args.kind, resolveDir: here });
    });
  },
};

mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: [join(here, "src", "main.js")],
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2022"],
  legalComments: "none",
  outfile: join(out, "app.js"),
  plugins: [ownRuntime],
  logLevel: "warning",
});
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
copyFileSync(join(here, "src", "app.css"), join(out, "app.css"));
