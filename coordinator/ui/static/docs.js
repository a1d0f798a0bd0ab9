"use strict";
// Starts Swagger UI on this coordinator's OpenAPI document. validatorUrl: null, or Swagger UI
// would ask a validator on the internet for a badge.
window.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    domNode: root,
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
