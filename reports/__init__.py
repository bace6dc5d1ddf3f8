"""gpudoctor.reports: the report model, its JSON schema, renderers and redaction."""
