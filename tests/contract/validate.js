// Validates OpenAPI documents (the files named on the command line) with
// @apidevtools/swagger-parser, pinned in package.json and installed into
// the build directory by `make contract-deps`: against the OpenAPI 3.1
// schema, and every $ref resolved. Prints "FILE: OK" or the error; exits
// 1 when a document is not valid.
"use strict";
const SwaggerParser = require("@apidevtools/swagger-parser");

async function main(files) {
  let failed = 0;
  for (const f of files) {
    try {
      const api = await SwaggerParser.validate(f);
      console.log(`${f}: OK (OpenAPI ${api.openapi})`);
    } catch (e) {
      console.log(`${f}: INVALID: ${e.message}`);
      failed++;
    }
  }
  return failed ? 1 : 0;
}

main(process.argv.slice(2)).then((rc) => process.exit(rc));
