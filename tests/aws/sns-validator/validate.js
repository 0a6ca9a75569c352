// Validates SNS messages with npm's sns-validator, as a Node subscriber would.
// argv[2]: the host pattern (a regular expression) the SigningCertURL's host must match;
// stdin: a JSON array of messages. Prints a JSON array: "ok" or the error's text, per message.
"use strict";
const MessageValidator = require("sns-validator");

const validator = new MessageValidator(new RegExp(process.argv[2]));
let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", async () => {
  const results = [];
  for (const message of JSON.parse(input)) {
    results.push(await new Promise((resolve) => {
      validator.validate(message, (error) => resolve(error ? String(error.message || error) : "ok"));
    }));
  }
  process.stdout.write(JSON.stringify(results));
});
