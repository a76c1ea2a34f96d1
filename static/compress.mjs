// The bundle's precompressed copies, which static/static.go serves to
// browsers that accept them (brotli first, then gzip): compressed once at
// build time at the highest settings, never per request.
//
//   node static/compress.mjs esbuild ARGS...
//     runs the bundler (package.json's build script), then writes X.br
//     (brotli, quality 11) and X.gz (gzip, level 9) beside each .js and
//     .css file X in its --outdir (the last one given: `npm run build --
//     --outdir=DIR` appends its own).
//
//   node static/compress.mjs --check DIR
//     fails unless every .js and .css file in DIR has both copies and each
//     decodes to it byte for byte (make generate-check).
//
// The copies depend only on the bundle and on this node's brotli and zlib:
// no file name or time goes into them, so a rebuild writes the same bytes.
// Another node may ship another zlib (node's is Chromium's fork, whose
// output differs from the system zlib's at the same level), so the check
// compares what the copies decode to, not their bytes.
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import zlib from "node:zlib";

const compressible = (name) => name.endsWith(".js") || name.endsWith(".css");

function brotli(data) {
  return zlib.brotliCompressSync(data, {
    params: {
      [zlib.constants.BROTLI_PARAM_QUALITY]: zlib.constants.BROTLI_MAX_QUALITY,
      [zlib.constants.BROTLI_PARAM_MODE]: zlib.constants.BROTLI_MODE_TEXT,
      [zlib.constants.BROTLI_PARAM_SIZE_HINT]: data.length,
    },
  });
}

function gzip(data) {
  const out = zlib.gzipSync(data, { level: zlib.constants.Z_BEST_COMPRESSION });
  // The header's operating system byte (RFC 1952) is the platform's that
  // built it: "unknown" makes it the same everywhere. Nothing checks it.
  out[9] = 255;
  return out;
}

function compress(dir) {
  for (const name of readdirSync(dir).filter(compressible).sort()) {
    const data = readFileSync(join(dir, name));
    writeFileSync(join(dir, name + ".br"), brotli(data));
    writeFileSync(join(dir, name + ".gz"), gzip(data));
  }
}

function check(dir) {
  const problems = [];
  for (const name of readdirSync(dir).filter(compressible).sort()) {
    const data = readFileSync(join(dir, name));
    for (const [ext, decode] of [[".br", zlib.brotliDecompressSync], [".gz", zlib.gunzipSync]]) {
      let copy;
      try {
        copy = readFileSync(join(dir, name + ext));
      } catch {
        problems.push(`${dir}/${name}${ext} is missing`);
        continue;
      }
      let decoded;
      try {
        decoded = decode(copy);
      } catch (err) {
        problems.push(`${dir}/${name}${ext} does not decode: ${err.message}`);
        continue;
      }
      if (!decoded.equals(data)) problems.push(`${dir}/${name}${ext} is not ${name}`);
    }
  }
  return problems;
}

const [first, ...rest] = process.argv.slice(2);
if (first === "--check" && rest.length === 1) {
  const problems = check(rest[0]);
  for (const p of problems) console.error(`${p}: run make generate and commit static/dist`);
  process.exit(problems.length ? 1 : 0);
}
if (!first || first.startsWith("-")) {
  console.error("usage: node static/compress.mjs esbuild ARGS... | --check DIR");
  process.exit(2);
}
const built = spawnSync(first, rest, { stdio: "inherit" });
if (built.error) throw built.error;
if (built.status !== 0) process.exit(built.status ?? 1);
const outdir = rest.filter((a) => a.startsWith("--outdir=")).at(-1)?.slice("--outdir=".length);
if (!outdir) {
  console.error("static/compress.mjs: the bundler's arguments name no --outdir=");
  process.exit(2);
}
compress(outdir);
