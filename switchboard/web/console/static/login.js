/* Switchboard console sign-in: posts JSON (a cross-site form cannot), then opens the console. */
"use strict";

(() => {
  const form = document.getElementById("login-form");
  const error = document.getElementById("login-error");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    const body = {
      name: document.getElementById("login-name").value,
      password: document.getElementById("login-password").value,
    };
    let response;
    try {
      response = await fetch("/console/login", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        credentials: "same-origin",
      });
    } catch (_) {
      error.textContent = "The gateway did not answer; try again.";
      error.hidden = false;
      return;
    }
    if (response.ok) {
      window.location.assign("/console");
      return;
    }
    let message = `Sign-in failed (${response.status}).`;
    try {
      const data = await response.json();
      if (data && data.error && typeof data.error.message === "string") message = data.error.message;
    } catch (_) {
      /* not JSON: keep the status */
    }
    error.textContent = message;
    error.hidden = false;
  });
})();
