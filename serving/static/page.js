"use strict";
// The API page's script: sends the form to /predict (same origin) and shows the certified answer. It fetches
// nothing from anywhere else; the page's Content-Security-Policy forbids it (serving/page.py).
(function () {
  const $ = (id) => document.getElementById(id);
  const authOn = document.body.dataset.auth === "on";

  function headers() {
    const key = $("api-key").value.trim();
    return authOn && key ? { "X-API-Key": key } : {};
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = false;
  }

  async function errorOf(response) {
    let text = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && typeof body.error === "string") text = `${response.status}: ${body.error}`;
    } catch (_) { /* not JSON: the status line */ }
    if (response.status === 401) text += " (type the server's API key above)";
    const retry = response.headers.get("Retry-After");
    if (retry) text += ` (retry in ${retry} s)`;
    return text;
  }

  function showPrediction(answer) {
    const p = answer.predictions[0];
    $("result-label").textContent = p.label === null ? "none (abstained)" : String(p.label);
    $("result-class-name").textContent = p.class_name === null ? "none" : p.class_name;
    $("result-radius").textContent = String(p.certified_radius);
    $("result-abstained").textContent = p.abstained ? "yes" : "no";
    $("result-samples").textContent = String(p.samples);
    $("result-outcome").textContent = p.outcome === undefined ? "certified at a fixed n" : p.outcome;
    $("result-json").textContent = JSON.stringify(answer, null, 2);
    $("result").hidden = false;
  }

  $("images").addEventListener("change", () => {
    const file = $("images").files[0];
    const preview = $("preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    if (file) {
      preview.src = URL.createObjectURL(file);  // a blob: URL of the chosen file, read locally
      preview.hidden = false;
    } else {
      preview.removeAttribute("src");
      preview.hidden = true;
    }
  });

  $("predict-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("error").hidden = true;
    $("result").hidden = true;
    const file = $("images").files[0];
    if (!file) return showError("choose a PNG or JPEG image first");
    const form = new FormData();
    form.append("images", file, file.name);
    for (const name of ["n", "radius"]) {
      const value = $(name).value.trim();
      if (value) form.append(name, value);
    }
    if ($("adaptive").checked) form.append("adaptive", "true");
    $("submit").disabled = true;
    $("status").textContent = "certifying...";
    const started = performance.now();
    try {
      const response = await fetch("predict", { method: "POST", body: form, headers: headers() });
      if (!response.ok) {
        showError(await errorOf(response));
        $("status").textContent = "";
        return;
      }
      showPrediction(await response.json());
      $("status").textContent = `answered in ${((performance.now() - started) / 1000).toFixed(2)} s`;
    } catch (error) {
      showError(`the request failed: ${error}`);
      $("status").textContent = "";
    } finally {
      $("submit").disabled = false;
    }
  });

  $("show-metadata").addEventListener("click", async () => {
    $("error").hidden = true;
    try {
      const response = await fetch("metadata", { method: "POST", headers: headers() });
      if (!response.ok) return showError(await errorOf(response));
      $("metadata").textContent = JSON.stringify(await response.json(), null, 2);
      $("metadata").hidden = false;
    } catch (error) {
      showError(`the request failed: ${error}`);
    }
  });
})();
