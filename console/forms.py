"""Console forms (all CSRF-protected by Django's middleware). They validate; the views hand the
cleaned data to ``console.services``."""

from __future__ import annotations

from django import forms

from console.models import Role
from inference.models import ModelPackage, RoutingPolicy
from nodes.models import Node


class NodeForm(forms.ModelForm):
    """Add or edit a node; ``node_id`` is fixed once the node exists."""

    package = forms.ModelChoiceField(
        queryset=ModelPackage.objects.all(), required=False, empty_label="(none)"
    )

    class Meta:
        model = Node
        fields = ["node_id", "address", "package", "weight", "affinity", "cpu_set", "threads"]
        widgets = {
            "address": forms.TextInput(attrs={"placeholder": "127.0.0.1:9401"}),
            "cpu_set": forms.TextInput(attrs={"placeholder": "0-3"}),
        }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["node_id"].disabled = True

    def changes(self) -> dict:
        """Cleaned data as ``console.services`` keyword arguments."""
        data = dict(self.cleaned_data)
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


class PackageForm(forms.Form):
    name = forms.SlugField(max_length=128)
    version = forms.CharField(max_length=64)
    gguf_path = forms.CharField(max_length=1024, label="GGUF path on this host")


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
